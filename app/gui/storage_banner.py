"""The banner at the top of the window when the disk refuses a write (full, read-only): the reason, "Retry",
which saves the reply kept in memory, and "Copy reply", so a reply is never lost to a full disk. It is not
modal: the chat stays usable, and the banner goes away by itself once a write succeeds."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton


class StorageBanner(QFrame):
    retry_requested = Signal()

    def __init__(self):
        super().__init__()
        self.setObjectName("storageBanner")
        self.setAccessibleName("Storage problem")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet("#storageBanner { background: palette(tool-tip-base); }")
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setAccessibleName("Why the last change was not saved")
        self.retry = QPushButton("Retry")
        self.retry.setAccessibleName("Retry saving the reply")
        self.retry.clicked.connect(self.retry_requested)
        self.copy = QPushButton("Copy reply")
        self.copy.setAccessibleName("Copy the unsaved reply")
        self.copy.clicked.connect(self._copy_reply)
        dismiss = QToolButton(text="✕")
        dismiss.setAccessibleName("Dismiss")
        dismiss.setToolTip("Hide this message (an unsaved reply is still saved with the next message)")
        dismiss.clicked.connect(self.hide)
        row = QHBoxLayout(self)
        row.setContentsMargins(12, 6, 6, 6)
        row.addWidget(self.message, 1)
        row.addWidget(self.retry)
        row.addWidget(self.copy)
        row.addWidget(dismiss)
        self.reply: str | None = None
        self.hide()

    def show_failure(self, message: str, reply: str | None) -> None:
        """`reply`: the text of a reply kept in memory that the store has not got yet (None: nothing pending)."""
        self.reply = reply
        self.message.setText(f"Not saved: {message}" if reply is None
                             else f"The last reply is not saved yet: {message}")
        self.retry.setVisible(reply is not None)
        self.copy.setVisible(reply is not None)
        self.show()

    def clear(self) -> None:
        self.reply = None
        self.hide()

    def _copy_reply(self) -> None:
        if self.reply:
            QGuiApplication.clipboard().setText(self.reply)
