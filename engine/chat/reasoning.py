"""A reply's reasoning, told apart from its answer while it streams.

Reasoning models write their reasoning before the answer, between markers their chat template knows:

- `think`: Qwen3 and the DeepSeek-R1 distills, `<think>reasoning</think>answer`. Some templates open the
  `<think>` in the prompt, so the reply starts inside the reasoning and only `</think>` appears in it.
- `harmony`: gpt-oss, messages on channels, `<|channel|>analysis<|message|>reasoning<|end|>` then
  `<|start|>assistant<|channel|>final<|message|>answer`; the analysis channel is the reasoning, any other
  the answer, and the header markup is neither.

A `ReasoningSplitter` reads the reply's text in whatever pieces it streams in (a marker may be split across
tokens: a piece that may be the start of one is held back until the next says) and returns answer pieces
as plain `str` and reasoning pieces as `Thought` (a `str` too, so pieces flow through every layer that
relays text unchanged; readers tell them apart by type). Whatever the pieces, the concatenated answer and
reasoning are the same: they are a function of the whole text. A model without a reasoning format gets no
splitter: its text is its answer, unchanged.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from dataclasses import dataclass
from enum import Enum

from engine.sampling.processor import StructuredProcessor


class Thought(str):
    """A piece of a reply's reasoning (a plain `str` piece is answer)."""


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    opener: str  # what opens the reasoning
    closer: str  # what a budget forces to close it: after it, the answer


THINK = ReasoningFormat("think", "<think>", "</think>")
HARMONY = ReasoningFormat("harmony", "<|channel|>analysis<|message|>",
                          "<|end|><|start|>assistant<|channel|>final<|message|>")

_HARMONY_MESSAGE = "<|message|>"
_HARMONY_ENDS = ("<|end|>", "<|return|>", "<|call|>")
_HARMONY_CHANNEL = re.compile(r"<\|channel\|>(\w+)")
_HARMONY_REASONING = "analysis"


def reasoning_format(template_source: str | None) -> ReasoningFormat | None:
    """The reasoning format a GGUF chat template writes past replies in, or None when it has none."""
    if not template_source:
        return None
    if "<|channel|>" in template_source and _HARMONY_REASONING in template_source:
        return HARMONY
    if THINK.closer in template_source:
        return THINK
    return None


class ReasoningAware(StructuredProcessor):
    """A logit processor that follows the reply's reasoning: at every turn's start (after `reset`) the turn
    tells it where the prompt leaves the reply."""

    @abstractmethod
    def begin(self, prompt_tail: str) -> None:
        """A reply starts after a prompt ending with `prompt_tail` (inside reasoning it opened, or not)."""


class _State(Enum):
    START = "start"          # think: the reply may open its reasoning (after whitespace)
    REASONING = "reasoning"
    ANSWER = "answer"
    HEADER = "header"        # harmony: a message's header, up to <|message|>


class ReasoningSplitter:
    """One reply's text, split into reasoning and answer pieces. `prompt_tail`, the end of the prompt the
    reply continues, says where the reply starts (inside reasoning the template opened, or not)."""

    def __init__(self, fmt: ReasoningFormat, prompt_tail: str = ""):
        self.format = fmt
        self._buffer = ""  # text not routed yet: it may be the start of a marker
        self._trim_newlines = False  # drop newlines that only separate a marker from what follows
        self._state = self._initial_state(prompt_tail.rstrip())

    @property
    def in_reasoning(self) -> bool:
        return self._state is _State.REASONING

    @property
    def may_open(self) -> bool:
        """The reply has written nothing but whitespace yet, and may still open its reasoning (think)."""
        return self._state is _State.START

    @property
    def answering(self) -> bool:
        return self._state is _State.ANSWER

    def _initial_state(self, tail: str) -> _State:
        if self.format is HARMONY:
            if not tail.endswith(_HARMONY_MESSAGE):
                return _State.HEADER
            return self._open_body(tail[tail.rfind("<|start|>"):])
        if tail.endswith(THINK.opener):
            self._trim_newlines = True
            return _State.REASONING
        return _State.START

    def push(self, text: str) -> list[str]:
        """The pieces `text` completes (answer as `str`, reasoning as `Thought`), in order."""
        self._buffer += text
        pieces: list[str] = []
        while self._buffer and self._step(pieces):
            pass
        return _merged(pieces)

    def finish(self) -> list[str]:
        """The pieces held back at the reply's end: a marker's start that no marker followed is text."""
        pieces: list[str] = []
        if self._state in (_State.START, _State.HEADER):
            self._state = _State.ANSWER  # never opened: what was held is the answer
        if self._state is _State.REASONING:
            self._buffer = self._buffer.rstrip()
        self._emit(pieces, self._buffer)
        self._buffer = ""
        return _merged(pieces)

    # -- the state machine: each step routes what it can of the buffer; False when it must wait --------
    def _step(self, pieces: list[str]) -> bool:
        if self._trim_newlines:
            self._buffer = self._buffer.lstrip("\n")
            if not self._buffer:
                return False
            self._trim_newlines = False
        if self._state is _State.START:
            return self._start()
        if self._state is _State.HEADER:
            return self._header()
        if self._state is _State.ANSWER and self.format is THINK:
            self._emit(pieces, self._buffer)
            self._buffer = ""
            return False
        ends = (THINK.closer,) if self.format is THINK else _HARMONY_ENDS
        found = _find_first(self._buffer, ends)
        if found is None:
            keep = _held_back(self._buffer, ends, self._state is _State.REASONING)
            self._emit(pieces, self._buffer[:len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep:]
            return False
        at, marker = found
        before = self._buffer[:at]
        self._emit(pieces, before.rstrip() if self._state is _State.REASONING else before)
        self._buffer = self._buffer[at + len(marker):]
        self._state = _State.ANSWER if self.format is THINK else _State.HEADER
        self._trim_newlines = self.format is THINK
        return True

    def _start(self) -> bool:
        head = self._buffer.lstrip()
        if head.startswith(THINK.opener):
            self._buffer = head[len(THINK.opener):]
            self._state, self._trim_newlines = _State.REASONING, True
            return True
        if THINK.opener.startswith(head):  # whitespace, or the opener's start: wait
            return False
        self._state = _State.ANSWER
        return True

    def _header(self) -> bool:
        at = self._buffer.find(_HARMONY_MESSAGE)
        if at >= 0:
            header, self._buffer = self._buffer[:at], self._buffer[at + len(_HARMONY_MESSAGE):]
            self._state = self._open_body(header)
            return True
        if not (self._buffer.startswith("<|") or "<|".startswith(self._buffer)):
            self._state = _State.ANSWER  # not harmony's markup: the model answered plainly
            return True
        return False

    @staticmethod
    def _open_body(header: str) -> _State:
        channel = _HARMONY_CHANNEL.search(header)
        return _State.REASONING if channel and channel.group(1) == _HARMONY_REASONING else _State.ANSWER

    def _emit(self, pieces: list[str], text: str) -> None:
        if text:
            pieces.append(Thought(text) if self._state is _State.REASONING else text)


def _find_first(text: str, markers: tuple[str, ...]) -> tuple[int, str] | None:
    found = [(at, m) for m in markers if (at := text.find(m)) >= 0]
    return min(found) if found else None


def _held_back(text: str, markers: tuple[str, ...], trailing_space: bool) -> int:
    """How many characters at the end of `text` to hold: the longest that may start a marker, and in
    reasoning the whitespace before it (reasoning is trimmed before its closing marker)."""
    keep = max((n for m in markers for n in range(min(len(m) - 1, len(text)), 0, -1)
                if m.startswith(text[-n:])), default=0)
    if trailing_space:
        body = text[:len(text) - keep]
        keep += len(body) - len(body.rstrip())
    return keep


def _merged(pieces: list[str]) -> list[str]:
    """Adjacent pieces of one kind as one."""
    out: list[str] = []
    for piece in pieces:
        if out and type(out[-1]) is type(piece):
            out[-1] = type(piece)(out[-1] + piece)
        else:
            out.append(piece)
    return out
