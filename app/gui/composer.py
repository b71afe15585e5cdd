"""The message input: Enter sends, Shift+Enter adds a line; Stop (or Esc, the window's shortcut) ends the
reply in progress. It stays editable while a reply streams (the next message can be typed), but sending
waits for the reply to end."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QHBoxLayout, QPlainTextEdit, QPushButton, QWidget


class MessageInput(QPlainTextEdit):
    submit = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submit.emit()
        else:
            super().keyPressEvent(event)


class Composer(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()

    def __init__(self):
        super().__init__()
        self.input = MessageInput()
        self.input.setPlaceholderText("Message (Enter sends, Shift+Enter adds a line)")
        self.input.setAccessibleName("Message input")
        self.input.setFixedHeight(72)
        self.send_button = QPushButton("Send")
        self.send_button.setAccessibleName("Send message")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setAccessibleName("Stop reply")
        self.stop_button.setToolTip("Stop the reply (Esc)")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 6, 12, 6)
        layout.addWidget(self.input)
        layout.addWidget(self.send_button)
        layout.addWidget(self.stop_button)
        self.input.submit.connect(self._submit)
        self.send_button.clicked.connect(self._submit)
        self.stop_button.clicked.connect(self.stop_requested)
        self.busy = False
        self.ready = False
        self._update_buttons()

    def set_busy(self, busy: bool) -> None:
        """A reply is streaming: Stop replaces Send."""
        self.busy = busy
        self._update_buttons()

    def set_ready(self, ready: bool) -> None:
        """A model is loaded; without one nothing can be sent."""
        self.ready = ready
        self._update_buttons()

    def _update_buttons(self) -> None:
        self.send_button.setVisible(not self.busy)
        self.send_button.setEnabled(self.ready)
        self.stop_button.setVisible(self.busy)

    def _submit(self) -> None:
        text = self.input.toPlainText().strip()
        if not text or self.busy or not self.ready:
            return
        self.input.clear()
        self.send_requested.emit(text)
