"""A streamed reply's text with its tool calls held back: what a front end shows as the reply's content while
the calls themselves are shown (or sent) apart, once the finished reply has been parsed."""

from __future__ import annotations


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


def _partial_suffix(text: str, opener: str) -> int:
    """The length of the longest end of `text` that is a proper start of `opener`."""
    for n in range(min(len(text), len(opener) - 1), 0, -1):
        if text.endswith(opener[:n]):
            return n
    return 0
