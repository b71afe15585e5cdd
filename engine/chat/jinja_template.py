"""A GGUF's own Jinja chat template, for models whose template is none of the built-in formats.

GGUF templates are untrusted input: they render in jinja2's ImmutableSandboxedEnvironment, under a wall-time
limit and an output-size limit. The sandbox stops attribute escapes; the limits stop a template from
hanging the app or exhausting memory. Every primitive that can make a value grow (the + * ** % ~ operators,
printed values, string methods and filters) weighs its inputs before building the result, so no single
step can run past the size limit, and a trace hook enforces the deadline between steps.
The environment mirrors Hugging Face's apply_chat_template (trim_blocks, lstrip_blocks, loop controls,
raise_exception, strftime_now, a tojson that keeps non-ASCII), which is what GGUF templates are written for.
"""

from __future__ import annotations

import json
import re
import sys
import time
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Callable, Sequence

from jinja2 import TemplateError
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.chat.templates import Message, check_history
from engine.errors import ChatTemplateError

MAX_OUTPUT = 16 << 20  # characters; far beyond any context window's worth of text
TIME_LIMIT_S = 2.0
_MAX_EXPONENT = 4096
_DENIED_STR_METHODS = frozenset({"format", "format_map", "expandtabs"})  # widths inside format specs


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
        self.filters = {name: self._guarded(f) for name, f in self.filters.items()}
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
        if operator == "*" and isinstance(right, int) and not isinstance(left, (int, float)):
            self._check(self.weigh(left) * max(right, 0))
        elif operator == "**" and isinstance(right, int) and abs(right) > _MAX_EXPONENT:
            raise _Oversized
        elif operator == "%" and isinstance(left, str):
            self.weigh(left, right, *_numbers(left))  # printf widths
        elif operator == "+":
            self.weigh(left, right)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's calling convention)
        target = getattr(__obj, "__self__", None)
        if isinstance(target, str):  # padding widths, replace and join can outgrow their inputs
            __self.weigh(target, *args, *kwargs.values())
            if __obj.__name__ == "replace" and len(args) >= 2:
                __self._weigh_replace(target, *args[:2])
            elif __obj.__name__ == "join" and args:
                __self._weigh_join(args[0], target)
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any):
        return None  # str.format is denied outright (is_safe_attribute) rather than sandbox-formatted

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, str) and attr in _DENIED_STR_METHODS:
            return False
        return super().is_safe_attribute(obj, attr, value)

    def _guarded(self, f: Callable) -> Callable:
        """A filter that weighs its arguments first and its result after (replace and join, whose results
        can dwarf their arguments, are weighed before they run)."""
        passes_context = getattr(f, "jinja_pass_arg", None) is not None

        def guarded(*args, **kwargs):
            plain = args[1:] if passes_context else args
            self.weigh(*plain, *kwargs.values())
            if f.__name__ == "do_replace" and len(plain) >= 3:
                self._weigh_replace(str(plain[0]), str(plain[1]), str(plain[2]))
            elif f.__name__ == "do_join" and plain:
                self._weigh_join(plain[0], str(plain[1]) if len(plain) > 1 else str(kwargs.get("d", "")))
            return self.bounded(f(*args, **kwargs))

        if passes_context:  # jinja hands the context to filters marked so
            guarded.jinja_pass_arg = f.jinja_pass_arg
        return guarded

    def _weigh_replace(self, s: str, old: Any, new: Any) -> None:
        if isinstance(old, str) and isinstance(new, str):
            self._check(len(s) + (s.count(old) if old else len(s) + 1) * len(new))

    def _weigh_join(self, items: Any, sep: str) -> None:
        if isinstance(items, (list, tuple)):
            self._check(self.weigh(*items) + len(sep) * len(items))


def _numbers(fmt: str) -> list[int]:
    """The integers written in a format string (printf widths and precisions)."""
    return [int(d) if len(d) < 12 else 10 ** 12 for d in re.findall(r"\d+", fmt)]


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


class JinjaTemplate:
    """A model's own chat template. It has no known stop marker: generation stops at the tokenizer's
    end-of-generation tokens. `strip_bos` drops a leading BOS text when the tokenizer adds BOS itself
    (as llama.cpp does), so the prompt never starts with two."""

    stop_marker = None

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "", strip_bos: bool = False,
                 max_output: int = MAX_OUTPUT, time_limit_s: float = TIME_LIMIT_S):
        self.source = source
        self._env = _BoundedSandbox(max_output)
        self._bos, self._eos, self._strip_bos = bos_token, eos_token, strip_bos
        self._time_limit_s = time_limit_s
        self._template = self._guard(lambda: self._env.from_string(source), "does not compile")

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = True,
               think_off: bool = False) -> str:
        context = dict(messages=[{"role": m.role, "content": m.content} for m in messages],
                       add_generation_prompt=add_generation_prompt, bos_token=self._bos, eos_token=self._eos)
        if think_off:
            context["enable_thinking"] = False
        text = self._guard(lambda: self._generate(context), "failed")
        if self._strip_bos and self._bos and text.startswith(self._bos):
            text = text[len(self._bos):]
        return text

    def _generate(self, context: dict) -> str:
        parts, size = [], 0
        for chunk in self._template.generate(**context):
            size += len(chunk)
            self._env._check(size)
            parts.append(chunk)
        return "".join(parts)

    def render_messages(self, messages: Sequence[Message], *, think_off: bool = False) -> str:
        check_history(messages)
        return self.render(messages, think_off=think_off)

    def _guard(self, work: Callable[[], Any], failure: str) -> Any:
        try:
            with _deadline(self._time_limit_s):
                return work()
        except _OutOfTime:
            raise ChatTemplateError(f"the model's chat template ran longer than {self._time_limit_s:g} s") from None
        except _Oversized:
            raise ChatTemplateError(
                f"the model's chat template produces more than {self._env.max_output} characters") from None
        except Exception as e:  # anything a hostile or broken template can raise, MemoryError included
            raise ChatTemplateError(f"the model's chat template {failure}: {type(e).__name__}: {e}") from None
