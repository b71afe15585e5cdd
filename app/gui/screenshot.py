"""`fucina --screenshot PATH`: render the window to a PNG (offscreen), for the docs and for tests.

The window starts as usual (except that it downloads no model); the picture is taken once the model has
loaded and the conversation is open (so the status bar shows real numbers), or after a timeout with
whatever is there by then.
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QApplication

from app.gui.main_window import MainWindow

SIZE = (1100, 720)
TIMEOUT_MS = 60_000
SETTLE_MS = 300  # lets layouts and the scroll position settle after the last message renders


class Screenshot(QObject):
    """Saves the window to `path` when it is ready, then quits the application. A QObject on the UI
    thread, so the worker's signals reach it queued, never on the worker's thread."""

    def __init__(self, window: MainWindow, path: Path):
        super().__init__(window)
        self.window, self.path, self.taken = window, path, False
        window.resize(*SIZE)
        window.client.worker.conversation_ready.connect(self.settle)
        window.client.worker.model_failed.connect(self.settle)
        if not window.model_requested:  # no model on disk: the window as it is, without one
            self.settle()
        QTimer.singleShot(TIMEOUT_MS, self.take)

    def settle(self, *_) -> None:
        QTimer.singleShot(SETTLE_MS, self.take)

    def take(self) -> None:
        if self.taken:
            return
        self.taken = True
        self.window.chat_view.scroll_to_bottom()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        saved = self.window.grab().save(str(self.path))
        if not saved:
            print(f"error: could not write {self.path}", file=sys.stderr)
        self.window.close()
        QApplication.exit(0 if saved else 2)
