"""One message in the chat: who wrote it, its text, the ‹ 1/2 › switcher between alternatives, and its
actions (copy; regenerate on the last reply, or answer a last user message left without one; edit on user
messages, which makes a new branch; delete)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication, QPalette
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QToolButton,
                               QVBoxLayout, QWidget)

from app.gui.json_view import JSON_FORMATS, JsonView
from app.gui.markdown_view import SELECTABLE, MarkdownView
from app.gui.theme import bubble_color

ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System"}


def _tool_button(text: str, accessible: str, tip: str) -> QToolButton:
    button = QToolButton(text=text)
    button.setAccessibleName(accessible)
    button.setToolTip(tip)
    button.setAutoRaise(True)
    return button


class MessageWidget(QFrame):
    regenerate_requested = Signal()
    edit_requested = Signal(str, str)     # message id, new text
    delete_requested = Signal(str)        # message id
    switch_requested = Signal(str)        # the sibling message id to show

    def __init__(self, message: dict, siblings: list[str], *, is_last: bool = False):
        """`message` is a store dict (an `id` of None marks one still being written; a reply whose meta names
        a JSON response format is shown as JSON); `siblings` the ids of the alternatives at its place in
        the tree, itself included."""
        super().__init__()
        self.message, self.siblings = message, siblings
        self.role = message["role"]
        self.setObjectName("message")
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setAutoFillBackground(True)
        palette = self.palette()
        palette.setColor(QPalette.ColorRole.Window, bubble_color(self, self.role))
        self.setPalette(palette)

        self.previous_button = self.next_button = None  # the ‹ › switcher, when there are alternatives
        self.header = QHBoxLayout()
        self.header.setContentsMargins(0, 0, 0, 0)
        role_label = QLabel(f"<b>{ROLE_NAMES.get(self.role, self.role)}</b>")
        self.header.addWidget(role_label)
        self._add_switcher()
        self.header.addStretch()
        self._add_actions(is_last)

        if self.role == "user":
            self.body = QLabel(message["content"])
            self.body.setTextFormat(Qt.TextFormat.PlainText)
            self.body.setWordWrap(True)
            self.body.setTextInteractionFlags(SELECTABLE)
        elif (message.get("meta") or {}).get("response_format") in JSON_FORMATS:
            self.body = JsonView(message["content"])
        else:
            self.body = MarkdownView(message["content"])
        self.column = QVBoxLayout(self)
        self.column.setContentsMargins(12, 6, 12, 10)
        self.column.setSpacing(4)
        self.column.addLayout(self.header)
        self.column.addWidget(self.body)
        self.editor: QWidget | None = None
        self.set_branch_actions_enabled(True)

    @property
    def message_id(self) -> str | None:
        return self.message["id"]

    @property
    def content(self) -> str:
        return self.message["content"]

    def set_content(self, text: str) -> None:
        """Streaming: the reply so far."""
        self.message = {**self.message, "content": text}
        if isinstance(self.body, MarkdownView):
            self.body.set_markdown(text)
        elif isinstance(self.body, JsonView):
            self.body.set_text(text)
        else:
            self.body.setText(text)

    def _add_switcher(self) -> None:
        if len(self.siblings) < 2 or self.message_id not in self.siblings:
            return
        index = self.siblings.index(self.message_id)
        self.previous_button = back = _tool_button("‹", "Previous alternative", "Show the previous alternative")
        self.next_button = forward = _tool_button("›", "Next alternative", "Show the next alternative")
        self.position_label = QLabel(f"{index + 1}/{len(self.siblings)}")
        self.position_label.setAccessibleName("Alternative")
        back.clicked.connect(lambda: self.switch_requested.emit(self.siblings[index - 1]))
        forward.clicked.connect(lambda: self.switch_requested.emit(self.siblings[index + 1]))
        for widget in (back, self.position_label, forward):
            self.header.addWidget(widget)

    def _add_actions(self, is_last: bool) -> None:
        self.actions_: dict[str, QToolButton] = {}  # trailing underscore: QWidget.actions() is taken
        specs = [("copy", "Copy", "Copy message", "Copy this message as Markdown")]
        if self.role == "assistant" and is_last:
            specs.append(("regenerate", "Regenerate", "Regenerate reply", "Write another reply in its place"))
        elif self.role == "user" and is_last:
            specs.append(("regenerate", "Answer", "Answer message", "Write a reply to this message"))
        if self.role == "user":
            specs.append(("edit", "Edit", "Edit message", "Edit and resend; the original stays as an alternative"))
        specs.append(("delete", "Delete", "Delete message", "Delete this message and everything after it"))
        for key, text, accessible, tip in specs:
            button = _tool_button(text, accessible, tip)
            self.header.addWidget(button)
            self.actions_[key] = button
        self.actions_["copy"].clicked.connect(lambda: QGuiApplication.clipboard().setText(self.content))
        if "regenerate" in self.actions_:
            self.actions_["regenerate"].clicked.connect(self.regenerate_requested)
        if "edit" in self.actions_:
            self.actions_["edit"].clicked.connect(self.start_editing)
        self.actions_["delete"].clicked.connect(lambda: self.delete_requested.emit(self.message_id))

    def set_branch_actions_enabled(self, enabled: bool) -> None:
        """Everything but Copy changes the conversation's tree, which waits while a reply streams."""
        enabled = enabled and self.message_id is not None
        for key, button in self.actions_.items():
            if key != "copy":
                button.setEnabled(enabled)
        if self.previous_button is not None:
            index = self.siblings.index(self.message_id)
            self.previous_button.setEnabled(enabled and index > 0)
            self.next_button.setEnabled(enabled and index < len(self.siblings) - 1)
        if self.editor is not None:
            self.save_edit_button.setEnabled(enabled)

    def start_editing(self) -> None:
        if self.editor is not None:
            return
        self.editor = QWidget()
        self.edit_box = QPlainTextEdit(self.content)
        self.edit_box.setAccessibleName("Edit message text")
        self.save_edit_button, cancel = QPushButton("Save and send"), QPushButton("Cancel")
        self.save_edit_button.clicked.connect(
            lambda: self.edit_requested.emit(self.message_id, self.edit_box.toPlainText()))
        cancel.clicked.connect(self.stop_editing)
        buttons = QHBoxLayout()
        buttons.addStretch()
        buttons.addWidget(cancel)
        buttons.addWidget(self.save_edit_button)
        column = QVBoxLayout(self.editor)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.edit_box)
        column.addLayout(buttons)
        self.body.hide()
        self.column.addWidget(self.editor)
        self.edit_box.setFocus()

    def stop_editing(self) -> None:
        if self.editor is not None:
            self.editor.deleteLater()
            self.editor = None
            self.body.show()
