"""The mark an empty reply shows until its first text arrives: "thinking" with dots that keep moving, so a
long prompt's reading or a slow first token never looks like a stalled app (the status line has the
numbers). A reply that waits for something known (kernels compiling) says what instead."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel, QWidget

FRAME_MS = 400
DOTS = 3


class ThinkingIndicator(QLabel):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setAccessibleName("Thinking")
        self.setEnabled(False)  # drawn in the palette's muted text colour
        self.setWordWrap(True)
        self._dots = 0
        self._wait: str | None = None
        self._timer = QTimer(self, interval=FRAME_MS)
        self._timer.timeout.connect(self._next_frame)
        self._timer.start()
        self._show_frame()

    def _next_frame(self) -> None:
        self._dots = (self._dots + 1) % (DOTS + 1)
        self._show_frame()

    def set_wait(self, text: str | None) -> None:
        """What the reply waits for, shown in place of "thinking" (its own numbers move; None: thinking)."""
        self._wait = text
        self._show_frame()

    def _show_frame(self) -> None:
        self.setText(self._wait or "thinking" + "." * self._dots)
