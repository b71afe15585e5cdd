"""How a model family writes tool calls: told from its chat template's text, and read back from a reply.

Four formats, each named by a marker its template spells (never by the model's name):

- `hermes` (Qwen2.5, Qwen3, Hermes; and the fallback for templates with no tool support, whose prompt then
  describes the tools in this format): `<tool_call>\\n{"name": .., "arguments": {..}}\\n</tool_call>`, any
  number per reply, with free text around them;
- `llama3` (Llama 3.1-3.3's JSON tool calling): the reply is `{"name": .., "parameters": {..}}`, optionally
  after `<|python_tag|>`;
- `harmony` (gpt-oss): `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{..}<|call|>`;
- `mistral`: `[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]`, or the newer `[TOOL_CALLS]NAME[ARGS]{..}`.

A call is a JSON object with a string name and an object of arguments; any text that is not exactly that
(unclosed, not JSON, arguments that are no object) is not a call: it stays in the reply's text, where the
user can see what the model wrote.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Collection

from engine.tools import ToolCall


@dataclass(frozen=True)
class ToolFormat:
    name: str
    opener: str       # the text that starts a call: from there the call grammar holds the reply
    closer: str       # the text that ends one call
    ends_reply: bool  # a call ends the reply (nothing but the stop follows); else text or more calls may
    pattern: re.Pattern  # one call in a reply's text; its groups are what `_read` takes
    _read: Callable[[re.Match], list[tuple[Any, Any]]]  # (name, arguments) pairs, unchecked
    # the calls are in message headers (harmony), which the reasoning split consumes: they are read from
    # the reply's raw text, and the constraint sees every token (not only the answer's)
    in_headers: bool = False
    # a whole reply that is one call without the format's markers (Qwen2.5-Coder writes Hermes calls so):
    # read as a call, though no grammar held it, when it names an offered tool
    bare: re.Pattern | None = None

    def parse_reply(self, raw: str, answer: str, names: Collection[str] | None = None) -> "ParsedReply":
        """The calls of a finished reply, from its raw text or its answer, and the answer less them; with
        `names`, a call to any other tool is no call."""
        if not self.in_headers:
            return self.parse(answer, names)
        found = self.parse(raw, names)
        content = answer
        for match in self.pattern.finditer(raw) if found.calls else ():
            content = content.replace(match.group(2), "", 1)  # the call's body, which the split kept as text
        return ParsedReply(content.strip() if found.calls else answer, found.calls)

    def parse(self, text: str, names: Collection[str] | None = None) -> "ParsedReply":
        """The calls in a reply's text and the text around them (with `names`: calls to those tools only)."""
        if self.bare is not None and (match := self.bare.fullmatch(text)) and names is not None:
            found = _checked(self._read(match), names)
            if found is not None:
                return ParsedReply("", tuple(ToolCall(new_call_id(), n, a) for n, a in found))
        calls, kept, at = [], [], 0
        for match in self.pattern.finditer(text):
            found = _checked(self._read(match), names)
            if found is None:  # not a call: it stays text
                continue
            kept.append(text[at:match.start()])
            at = match.end()
            calls += [ToolCall(new_call_id(), name, arguments) for name, arguments in found]
        kept.append(text[at:])
        return ParsedReply("".join(kept).strip() if calls else text, tuple(calls))


@dataclass(frozen=True)
class ParsedReply:
    content: str  # the reply less its calls
    calls: tuple[ToolCall, ...]


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _checked(pairs: list[tuple[Any, Any]] | None, names: Collection[str] | None) -> list[tuple[str, dict]] | None:
    if not pairs:
        return None
    out = []
    for name, arguments in pairs:
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            arguments = _json(arguments)
        if not isinstance(name, str) or not name or not isinstance(arguments, dict):
            return None
        if names is not None and name not in names:
            return None
        out.append((name, arguments))
    return out


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _named(obj: Any, arguments_key: str) -> list[tuple[Any, Any]] | None:
    if not isinstance(obj, dict) or arguments_key not in obj:
        return None
    return [(obj.get("name"), obj[arguments_key])]


def _read_hermes(match: re.Match) -> list[tuple[Any, Any]] | None:
    return _named(_json(match.group(1)), "arguments")


def _read_llama3(match: re.Match) -> list[tuple[Any, Any]] | None:
    obj = _json(match.group(1))
    return _named(obj, "parameters") or _named(obj, "arguments")


def _read_harmony(match: re.Match) -> list[tuple[Any, Any]] | None:
    return [(match.group(1), _json(match.group(2)))]


def _read_mistral(match: re.Match) -> list[tuple[Any, Any]] | None:
    if match.group(1) is not None:  # the newer NAME[ARGS]{..}
        return [(match.group(1), _json(match.group(2)))]
    calls = _json(match.group(3))
    if not isinstance(calls, list) or not calls:
        return None
    pairs = [_named(c, "arguments") for c in calls]
    return None if None in pairs else [p[0] for p in pairs]


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>", False,
                    re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL), _read_hermes,
                    bare=re.compile(r"\s*(\{.*\})\s*", re.DOTALL))
# the whole reply is the call, so the pattern is anchored at both ends
LLAMA3 = ToolFormat("llama3", '{"name": "', "", True,
                    re.compile(r"\A\s*(?:<\|python_tag\|>)?\s*(\{.*\})\s*\Z", re.DOTALL), _read_llama3)
HARMONY = ToolFormat("harmony", "to=functions.", "<|call|>", True,
                     re.compile(r"to=functions\.([\w.-]+)[^<]*(?:<\|constrain\|>\s*json\s*)?<\|message\|>(.*?)"
                                r"(?:<\|call\|>|\Z)", re.DOTALL), _read_harmony, in_headers=True)
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", "", True,
                     re.compile(r"\[TOOL_CALLS\]\s*(?:([\w.-]+)\[ARGS\](\{.*\})|(\[.*\]))\s*\Z", re.DOTALL),
                     _read_mistral)
FORMATS = {f.name: f for f in (HERMES, LLAMA3, HARMONY, MISTRAL)}

# Checked in order: the first marker a template spells names its format.
_MARKERS = [("<tool_call>", HERMES), ("to=functions", HARMONY), ("[TOOL_CALLS]", MISTRAL),
            ("<|python_tag|>", LLAMA3), ('"parameters"', LLAMA3)]


def detect_tool_format(template_source: str | None) -> ToolFormat:
    """The format a template's model writes calls in; Hermes where it names none (a template without tool
    support has the tools described in its prompt in Hermes's format: engine.chat.tool_render)."""
    for marker, fmt in _MARKERS:
        if template_source and marker in template_source:
            return fmt
    return HERMES
