"""How the terminal shows a reply's pieces (engine.chat.reasoning): its reasoning dimmed, before its answer."""

from __future__ import annotations

import sys

from engine.chat.reasoning import Thought


class ReplyPrinter:
    """A reply's pieces as the terminal shows them: the reasoning dimmed before the answer. From a pipe the
    reasoning goes to stderr, so stdout still holds only the answers."""

    DIM, PLAIN = "\x1b[2m", "\x1b[0m"

    def __init__(self, out=None, err=None):
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.terminal = self.out.isatty()
        self.thinking = False

    def __call__(self, piece: str) -> None:
        if isinstance(piece, Thought):
            if not self.thinking:
                self.thinking = True
                self._reasoning(self.DIM + "Thinking: " if self.terminal else "(thinking) ")
            self._reasoning(piece)
            return
        self.end_reasoning("\n\n")
        print(piece, end="", flush=True, file=self.out)

    def end_reasoning(self, separator: str = "\n") -> None:
        """Close the reasoning shown (at the answer's start, or at a reply that ends while reasoning)."""
        if self.thinking:
            self.thinking = False
            self._reasoning(self.PLAIN + separator if self.terminal else "\n")

    def _reasoning(self, text: str) -> None:
        print(text, end="", flush=True, file=self.out if self.terminal else self.err)
