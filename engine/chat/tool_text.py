"""A streamed reply's text with its tool calls held back: what a front end shows as the reply's content while
the calls themselves are shown (or sent) apart, once the finished reply has been parsed."""

from __future__ import annotations

from typing import Generator, Iterator

from engine.chat.reasoning import Thought


class CallTextFilter:
    """Passes a reply's pieces through up to the first call's opener; text that may be the opener's start
    waits for the next piece, and from the opener on nothing passes (the calls and what follows them are
    the parsed reply's to tell)."""

    def __init__(self, opener: str):
        self.opener = opener
        self._held = ""
        self.calling = False

    def push(self, piece: str) -> str:
        if self.calling:
            return ""
        text = self._held + piece
        at = text.find(self.opener)
        if at >= 0:
            self.calling, self._held = True, ""
            return text[:at]
        keep = _partial_suffix(text, self.opener)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def finish(self) -> str:
        """What was held back at the end of a reply that made no call."""
        held, self._held = ("" if self.calling else self._held), ""
        return held


def without_call_text(rounds: Generator, opener: str) -> Iterator:
    """A tool turn's stream (engine.chat.tool_rounds: reply pieces, and a ToolRan between rounds) with each
    reply's calls held back from its answer pieces; reasoning and everything that is not text pass as they
    are. A front end shows the calls from the parsed reply instead of their markup as it streams."""
    calls = CallTextFilter(opener)
    try:
        for piece in rounds:
            if isinstance(piece, Thought) or not isinstance(piece, str):
                if not isinstance(piece, str):  # a round's calls ran: the next reply is filtered afresh
                    calls = CallTextFilter(opener)
                yield piece
            elif shown := calls.push(piece):
                yield shown
        if held := calls.finish():
            yield held
    finally:
        rounds.close()  # the rounds end now (and restore what they changed), not when collected


def _partial_suffix(text: str, opener: str) -> int:
    """The length of the longest end of `text` that is a proper start of `opener`."""
    for n in range(min(len(text), len(opener) - 1), 0, -1):
        if text.endswith(opener[:n]):
            return n
    return 0
