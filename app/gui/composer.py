"""The message input: Enter sends, Shift+Enter adds a line; Stop (or Esc, the window's shortcut) ends the
reply in progress. It stays editable while a reply streams (the next message can be typed), but sending
waits for the reply to end. The box grows with its text, up to MAX_LINES, then scrolls."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QPlainTextEdit, QWidget

from app.gui.icons import IconButton
from app.gui.theme import SPACE_L, SPACE_M, SPACE_XL, centred

MIN_LINES, MAX_LINES = 1, 10


class MessageInput(QPlainTextEdit):
    submit = Signal()

    def __init__(self):
        super().__init__()
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self._fit()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submit.emit()
        else:
            super().keyPressEvent(event)

    def height_for_lines(self, lines: int) -> int:
        frame = int(self.document().documentMargin() * 2) + self.frameWidth() * 2 + 4  # + the style's padding
        return lines * self.fontMetrics().lineSpacing() + frame

    def _fit(self, *_) -> None:
        """As tall as the text (its wrapped lines), between MIN_LINES and MAX_LINES."""
        lines = max(MIN_LINES, min(MAX_LINES, int(self.document().documentLayout().documentSize().height())))
        self.setFixedHeight(self.height_for_lines(lines))

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit()  # a narrower box wraps into more lines


class Composer(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()

    def __init__(self):
        super().__init__()
        self.input = MessageInput()
        self.input.setPlaceholderText("Message Fucina (Enter sends, Shift+Enter adds a line)")
        self.input.setAccessibleName("Message input")
        self.send_button = IconButton("send", "Send message", "Send (Enter)", on_accent=True)
        self.send_button.setObjectName("sendButton")
        self.stop_button = IconButton("stop", "Stop reply", "Stop the reply (Esc)", on_accent=True)
        self.stop_button.setObjectName("stopButton")
        self.box = QFrame()  # the rounded field around the input and its buttons
        self.box.setObjectName("composerBox")
        self.tools = QHBoxLayout()  # buttons beside the input (an attach button goes here)
        self.tools.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout(self.box)
        row.setContentsMargins(SPACE_M + 4, SPACE_M, SPACE_M, SPACE_M)
        row.addLayout(self.tools)
        row.addWidget(self.input, 1)
        row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self.stop_button, 0, Qt.AlignmentFlag.AlignBottom)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(SPACE_XL, SPACE_M, SPACE_XL, SPACE_L)
        centred(self.box, layout)
        for button in (self.send_button, self.stop_button):
            button.setFixedSize(32, 32)
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
