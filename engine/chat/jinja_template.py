"""A GGUF's own Jinja chat template, for models whose template is none of the built-in formats.

GGUF templates are untrusted input: whatever a template does, its render ends within TIME_LIMIT_S and
allocates at most MEMORY_LIMIT bytes (where the platform enforces a limit), or fails with a
ChatTemplateError naming the template. Two layers enforce it:

1. Operator checks, always. The template renders in jinja2's ImmutableSandboxedEnvironment (no attribute
   escapes) where every primitive that can make a value grow weighs its inputs before the C code building
   the result runs: the + * ** % ~ operators (an int's result is bounded in bits, so `(9 ** 4096) ** 4096`
   never starts), printed values, string methods (str.format, format_map, expandtabs and translate are
   denied) and filters (join, replace, format, indent, wordwrap and tojson by their result's worst size;
   the rest by their inputs and result). A trace hook enforces the deadline between Python steps (nested
   loops, recursion). These bound each step, not the sum of many steps, and a C call that is merely slow
   is not interruptible.
2. A renderer process where the platform allows (engine.chat.render_process): renders run in a persistent
   child whose address space is capped (RLIMIT_AS, Linux) and which the parent kills at the deadline, C
   code or not; the next render starts a fresh child. The waiting thread holds no GIL, so the app stays
   responsive while a hostile render runs out its time. When no child can be started, renders fall back
   to layer 1 in-process; where RLIMIT_AS is not enforced (macOS, Windows) the kill still bounds time and
   layer 1 alone bounds memory, step by step.

Measured (2 shared cores, under load): a one-message chat renders in 0.05-0.09 ms in-process and
0.12-0.14 ms through the child, a 21-message one (12.5k characters) in 0.4-1.0 ms in-process and about
0.1 ms more through the child: the pickled round trip. Starting the child (spawn, importing the engine)
takes 0.25-0.7 s, once, when the first template is compiled (at model load), and again after a kill; it
holds about 105 MB. Every hostile case in tests/engine/chat/test_jinja_template.py fails within the
deadline plus the 0.2 s kill grace; with the child, the app process's peak RSS does not move (104 MB) and
the child's stays under its start size + 256 MB (349 MB for the worst case, 40 values of 16M characters).
Layer 1 alone is cheap and covers the known amplifiers, but it bounds one step at a time: 40 values of 16M
characters each, or one str.split into millions of small strings, still reach hundreds of MB in-process,
which is why the child is the default.

The environment mirrors Hugging Face's apply_chat_template (trim_blocks, lstrip_blocks, loop controls,
raise_exception, strftime_now, a tojson that keeps non-ASCII), which is what GGUF templates are written for.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Callable, Sequence

from jinja2 import TemplateError
from jinja2.compiler import CodeGenerator
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.chat.reasoning import reasoning_format
from engine.chat.render_process import LimitedProcess, ProcessUnavailable
from engine.chat.templates import Message, check_history
from engine.errors import ChatTemplateError

MAX_OUTPUT = 16 << 20  # characters; far beyond any context window's worth of text
TIME_LIMIT_S = 2.0
MEMORY_LIMIT = 256 << 20  # bytes a render may allocate in the renderer process
_KILL_GRACE_S = 0.2  # past the deadline, for the child's own trace hook to answer before it is killed
_MAX_INT_BITS = 1 << 16  # far beyond any count or id a template needs
# str methods whose result size hides inside an argument: format widths, tab sizes, translation tables
_DENIED_STR_METHODS = frozenset({"format", "format_map", "expandtabs", "translate"})
_NAME = "the model's chat template (tokenizer.chat_template)"
_TOOLS_VARIABLE = re.compile(r"\btools\b")  # `if tools`, `for tool in tools`, `tools | tojson`


class _Oversized(Exception):
    pass


class _OutOfTime(BaseException):  # BaseException: template helpers that catch Exception must not swallow it
    pass


class _BoundedCodeGenerator(CodeGenerator):
    """Routes every `~` concatenation through the environment's size check."""

    def visit_Concat(self, node, frame):
        self.write("environment.bounded(")
        super().visit_Concat(node, frame)
        self.write(")")


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, max_output: int):
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"],
                         finalize=self.bounded)
        self.max_output = max_output
        self.filters["tojson"] = _tojson
        self.filters = {name: self._guarded(f, _FILTER_GROWTH.get(name)) for name, f in self.filters.items()}
        del self.globals["lipsum"]  # generates arbitrary amounts of text
        self.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)

    def weigh(self, *values: Any) -> int:
        """The characters printing the values would take, roughly; raises past the output limit. Walks
        nested containers on a budget, so shared references (a list holding itself twice, 40 levels
        deep) cannot blow the walk up."""
        stack, total = list(values), 0
        while stack:
            v = stack.pop()
            if isinstance(v, str):
                total += len(v)
            elif isinstance(v, (list, tuple, set, frozenset, dict)):
                total += 2 + 2 * len(v)
                if total <= self.max_output:
                    stack.extend(v.items() if isinstance(v, dict) else v)
            elif isinstance(v, range):
                total += 2 + 2 * len(v)  # the sandbox caps its length; its numbers print short
            elif isinstance(v, int) and abs(v) > self.max_output:
                total += abs(v)  # a count or width that large can only build something oversized
            else:
                total += 1
            self._check(total)
        return total

    def _check(self, size: int) -> None:
        if size > self.max_output:
            raise _Oversized

    def bounded(self, value: Any) -> Any:
        self.weigh(value)
        return value

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*" and isinstance(left, int) and not isinstance(right, (int, float)):
            left, right = right, left  # 3 * "ab" is "ab" * 3
        if isinstance(left, int) and isinstance(right, int):
            self._check_int_result(operator, left, right)
        elif operator == "*" and isinstance(right, int) and not isinstance(left, (int, float)):
            self._check(self.weigh(left) * max(right, 0))
        elif operator == "%" and isinstance(left, str):
            self._check(self.printf_size(left, right))
        elif operator == "+":
            self.weigh(left, right)
        return super().call_binop(context, operator, left, right)

    def _check_int_result(self, operator: str, left: int, right: int) -> None:
        """Big-int arithmetic is C code that cannot be interrupted: bound the result's bits up front."""
        if operator == "**" and abs(left) > 1 and right > 0:
            bits = left.bit_length() * right
        elif operator == "*":
            bits = left.bit_length() + right.bit_length()
        else:
            return
        if bits > _MAX_INT_BITS:
            raise _Oversized

    def printf_size(self, fmt: str, args: Any) -> int:
        """An upper bound on `fmt % args`: the inputs plus every width and precision, written in the
        format or (with `*`) passed as arguments."""
        specs = _PRINTF_SPEC.findall(fmt)
        size = self.weigh(fmt, args) + sum(int(d) if len(d) < 12 else 10 ** 12
                                           for spec in specs for d in re.findall(r"\d+", spec))
        if any("*" in spec for spec in specs):
            size += sum(abs(a) for a in (args if isinstance(args, tuple) else (args,)) if isinstance(a, int))
        return size

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's calling convention)
        target = getattr(__obj, "__self__", None)
        if isinstance(target, str):  # padding widths, replace and join can outgrow their inputs
            if __obj.__name__ == "join" and args:
                args = (_materialized(args[0]), *args[1:])
            __self.weigh(target, *args, *kwargs.values())
            if __obj.__name__ == "replace" and len(args) >= 2:
                __self._check(_replaced_size(target, *args[:2]))
            elif __obj.__name__ == "join" and args:
                __self._check(_joined_size(__self, args[0], target))
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any):
        return None  # str.format is denied outright (is_safe_attribute) rather than sandbox-formatted

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, str) and attr in _DENIED_STR_METHODS:
            return False
        return super().is_safe_attribute(obj, attr, value)

    def _guarded(self, f: Callable, growth: Callable[..., int] | None) -> Callable:
        """A filter that weighs its arguments first, checks the worst size of its result when that can
        dwarf its arguments (`growth`), and weighs its result after. A lazy sequence (map, select)
        becomes a list first, so that what it holds is weighed."""
        passes_context = getattr(f, "jinja_pass_arg", None) is not None

        def guarded(*args, **kwargs):
            head, plain = (args[:1], args[1:]) if passes_context else ((), args)
            if plain:
                plain = (_materialized(plain[0]), *plain[1:])
            self.weigh(*plain, *kwargs.values())
            if growth is not None:
                self._check(growth(self, *plain, **kwargs))
            return self.bounded(f(*head, *plain, **kwargs))

        if passes_context:  # jinja hands the context to filters marked so
            guarded.jinja_pass_arg = f.jinja_pass_arg
        return guarded


_PRINTF_SPEC = re.compile(r"%(?:\([^)]*\))?([^a-zA-Z%]*)")  # what sits between % and the conversion letter


def _materialized(value: Any) -> Any:
    """A lazy sequence as a list; a for loop's own `loop` stays itself, since listing it would end the loop."""
    return list(value) if isinstance(value, Iterator) and not isinstance(value, LoopContext) else value


def _replaced_size(s: Any, old: Any, new: Any) -> int:
    s, old, new = str(s), str(old), str(new)
    return len(s) + (s.count(old) if old else len(s) + 1) * len(new)


def _joined_size(env: _BoundedSandbox, items: Any, sep: Any) -> int:
    """The size of `sep.join(items)`, a lazy sequence being a list by now."""
    if isinstance(items, str):
        return len(items) * (1 + len(str(sep)))
    if isinstance(items, (list, tuple, range, dict, set, frozenset)):
        return env.weigh(*items) + len(str(sep)) * len(items)
    return 0  # nothing join can iterate: it raises


def _width(value: Any) -> int:
    """The characters an indent-like argument (a count of spaces or a string) adds per line."""
    return value if isinstance(value, int) else len(str(value)) if value is not None else 0


def _depth(value: Any) -> int:
    """How deeply containers nest in an already weighed value (so the walk is bounded too)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, level = stack.pop()
        if isinstance(v, (list, tuple, set, frozenset, dict)):
            deepest = max(deepest, level + 1)
            stack.extend((item, level + 1) for item in (v.values() if isinstance(v, dict) else v))
    return deepest


# The worst size of a filter's result where it can dwarf the filter's arguments (called with them).
_FILTER_GROWTH: dict[str, Callable[..., int]] = {
    "join": lambda env, value, d="", attribute=None: _joined_size(env, value, d),
    "replace": lambda env, s, old, new, count=None: _replaced_size(s, old, new),
    "format": lambda env, value, *args, **kwargs: env.printf_size(str(value), kwargs or args),
    "indent": lambda env, s, width=4, first=False, blank=False: (
        len(str(s)) + (str(s).count("\n") + 1) * _width(width)),
    "wordwrap": lambda env, s, width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True: (
        len(str(s)) * (1 + len(wrapstring if wrapstring is not None else "\n"))),
    "tojson": lambda env, value, ensure_ascii=False, indent=None, separators=None, sort_keys=False: (
        env.weigh(value) * (2 + _width(indent) * _depth(value) + env.weigh(separators))),
}


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message):
    raise TemplateError(message)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


@contextmanager
def _deadline(seconds: float):
    """Raise _OutOfTime in whatever Python code runs on this thread past the deadline."""
    end = time.monotonic() + seconds

    def trace(frame, event, arg):
        if time.monotonic() > end:
            raise _OutOfTime
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        yield
    finally:
        sys.settrace(previous)


class _BoundedTemplate:
    """Layer 1: a compiled template that renders in this process under the operator checks and the
    deadline, every failure a ChatTemplateError."""

    def __init__(self, source: str, max_output: int, time_limit_s: float):
        self._env = _BoundedSandbox(max_output)
        self._time_limit_s = time_limit_s
        self._template = self._guard(lambda: self._env.from_string(source), "does not compile")

    def render(self, context: dict) -> str:
        return self._guard(lambda: self._generate(context), "failed")

    def _generate(self, context: dict) -> str:
        parts, size = [], 0
        for chunk in self._template.generate(**context):
            size += len(chunk)
            self._env._check(size)
            parts.append(chunk)
        return "".join(parts)

    def _guard(self, work: Callable[[], Any], failure: str) -> Any:
        try:
            with _deadline(self._time_limit_s):
                return work()
        except _OutOfTime:
            raise _out_of_time(self._time_limit_s) from None
        except _Oversized:
            raise ChatTemplateError(f"{_NAME} produces more than {self._env.max_output} characters") from None
        except MemoryError:
            raise ChatTemplateError(f"{_NAME} needs more than {MEMORY_LIMIT >> 20} MB of memory") from None
        except Exception as e:  # anything a hostile or broken template can raise
            raise ChatTemplateError(f"{_NAME} {failure}: {type(e).__name__}: {e}") from None


def _out_of_time(seconds: float) -> ChatTemplateError:
    return ChatTemplateError(f"{_NAME} ran longer than {seconds:g} s")


@functools.lru_cache(maxsize=16)
def _compiled(source: str, max_output: int, time_limit_s: float) -> _BoundedTemplate:
    return _BoundedTemplate(source, max_output, time_limit_s)


def _render_in_child(source: str, max_output: int, time_limit_s: float, context: dict | None) -> str | None:
    """Layer 2's handler: compile (cached) and, given a context, render. A compile-only call (context
    None) reports a template that does not compile when the template is made."""
    template = _compiled(source, max_output, time_limit_s)
    return None if context is None else template.render(context)


def _message_dict(message: Message) -> dict:
    """A message as templates read it. A reply's reasoning goes apart from its content, under both names
    templates read it by (Qwen3 and the R1 distills: reasoning_content; gpt-oss: thinking); the template
    decides whether a past reply's reasoning is rendered."""
    out = {"role": message.role, "content": message.content}
    if message.reasoning:
        out["reasoning_content"] = out["thinking"] = message.reasoning
    if message.tool_calls:  # OpenAI's shape, the arguments an object (templates write them with tojson)
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for c in message.tool_calls]
    if message.role == "tool":
        out["tool_call_id"], out["name"] = message.tool_call_id, message.name
    return out


RENDERER = LimitedProcess(_render_in_child, MEMORY_LIMIT)  # shared by every template; started on first use


class JinjaTemplate:
    """A model's own chat template. It has no known stop marker: generation stops at the tokenizer's
    end-of-generation tokens. `strip_bos` drops a leading BOS text when the tokenizer adds BOS itself
    (as llama.cpp does), so the prompt never starts with two. `isolated=False` renders in this process
    (layer 1 only); by default renders go through the renderer process, in-process only where none
    can be started."""

    stop_marker = None

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "", strip_bos: bool = False,
                 max_output: int = MAX_OUTPUT, time_limit_s: float = TIME_LIMIT_S, isolated: bool = True):
        self.source = source
        self.reasoning = reasoning_format(source)
        self._bos, self._eos, self._strip_bos = bos_token, eos_token, strip_bos
        self._spec = (source, max_output, time_limit_s)
        self._local = None if isolated else _BoundedTemplate(*self._spec)
        self._run(None)  # compiles, so a template that does not compile fails here

    @property
    def isolated(self) -> bool:
        """Whether renders run in the renderer process (False once it could not be started)."""
        return self._local is None

    @property
    def renders_tools(self) -> bool:
        """Whether the template reads a `tools` variable (a chat's tools are then its to render)."""
        return _TOOLS_VARIABLE.search(self.source) is not None

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = True,
               think_off: bool = False, reasoning_effort: str | None = None,
               tools: Sequence[dict] | None = None) -> str:
        context = dict(messages=[_message_dict(m) for m in messages],
                       add_generation_prompt=add_generation_prompt, bos_token=self._bos, eos_token=self._eos)
        if tools:  # OpenAI tool objects (ToolSpec.as_openai)
            context["tools"] = list(tools)
        if think_off:
            context["enable_thinking"] = False
        if reasoning_effort is not None:
            context["reasoning_effort"] = reasoning_effort
        text = self._run(context)
        if self._strip_bos and self._bos and text.startswith(self._bos):
            text = text[len(self._bos):]
        return text

    def render_messages(self, messages: Sequence[Message], *, think_off: bool = False,
                        reasoning_effort: str | None = None, tools: Sequence[dict] | None = None) -> str:
        check_history(messages)
        return self.render(messages, think_off=think_off, reasoning_effort=reasoning_effort, tools=tools)

    def render_reference(self, content: str) -> str:
        """Reference material (an attached document) as a system message a chat can follow."""
        return self.render([Message("system", content)], add_generation_prompt=False)

    def _run(self, context: dict | None) -> str | None:
        if self._local is None:
            time_limit_s = self._spec[2]
            try:
                return RENDERER.call(*self._spec, context, timeout_s=time_limit_s + _KILL_GRACE_S)
            except TimeoutError:
                raise _out_of_time(time_limit_s) from None
            except ChildProcessError:  # the kernel killed it, or C code crashed it
                raise ChatTemplateError(f"{_NAME} crashed the process rendering it") from None
            except ProcessUnavailable:
                self._local = _BoundedTemplate(*self._spec)
        return None if context is None else self._local.render(context)
