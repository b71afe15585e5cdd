"""One message in the chat: a rounded card (the user's on the accent's tint, indented from the left; replies
full width) with who wrote it, a reply's reasoning folded above its answer (app.gui.thinking_block), its
text, the ‹ 1/2 › switcher between alternatives, a "stopped" mark on a reply the user stopped, Show more /
less on a long message, and its actions as icon buttons (copy; regenerate on the last reply, or answer a
last user message left without one; edit on user messages, which makes a new branch; delete), shown while
the pointer is over the card or the focus is in it."""

from __future__ import annotations

import json

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QApplication, QFrame, QGraphicsOpacityEffect, QHBoxLayout, QLabel,
                               QPlainTextEdit, QPushButton, QVBoxLayout, QWidget)

from app.gui.icons import IconButton
from app.gui.json_view import JSON_FORMATS, JsonView
from app.gui.markdown_view import SELECTABLE, MarkdownView
from app.gui.message_model import is_stopped, response_format
from app.gui.theme import SPACE_L, SPACE_M, repolish
from app.gui.thinking_block import ThinkingBlock

ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System", "tool": "Tool"}
USER_INDENT_PX = 96          # the user's cards sit to the right, as in other chat apps
LONG_MESSAGE_CHARS = 3000    # longer messages open collapsed...
LONG_MESSAGE_LINES = 40
COLLAPSED_HEIGHT_PX = 320    # ...to this height


def is_long(text: str) -> bool:
    return len(text) > LONG_MESSAGE_CHARS or text.count("\n") >= LONG_MESSAGE_LINES


def _author(message: dict) -> str:
    """Who wrote it, as its card's header says: a tool message names its tool and a failure."""
    result = message.get("tool_result")
    if result is None:
        return ROLE_NAMES.get(message["role"], message["role"])
    seconds = result.get("seconds")
    took = "" if seconds is None else f" · {seconds:.2f} s"
    return f"Tool result: {result['name']}" + (" (failed)" if result["is_error"] else "") + took


def _call_label(call: dict) -> QLabel:
    label = QLabel(f"Called {call['name']}({json.dumps(call['arguments'], ensure_ascii=False)})")
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setWordWrap(True)
    label.setTextInteractionFlags(SELECTABLE)
    label.setProperty("tone", "muted")
    return label


class MessageWidget(QWidget):
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
        self.card = QFrame()
        self.card.setObjectName("message")
        self.card.setProperty("card", self.role)
        self.card.setFocusPolicy(Qt.FocusPolicy.TabFocus)  # Tab onto a card shows its actions
        self.card.setAccessibleName(f"{ROLE_NAMES.get(self.role, self.role)} message")
        outer = QHBoxLayout(self)
        outer.setContentsMargins(USER_INDENT_PX if self.role == "user" else 0, 0, 0, 0)
        outer.addWidget(self.card)

        self.previous_button = self.next_button = None  # the ‹ › switcher, when there are alternatives
        self.header = QHBoxLayout()
        self.header.setContentsMargins(0, 0, 0, 0)
        self.header.setSpacing(2)
        role_label = QLabel(_author(message))
        role_label.setObjectName("roleLabel")
        self.header.addWidget(role_label)
        self.header.addSpacing(SPACE_M)
        self._add_switcher()
        self.stopped_mark = self._add_stopped_mark()
        self.closing_marks = self._add_closing_marks()
        self.header.addStretch()
        self._add_actions(is_last)

        if self.role in ("user", "tool"):  # the user's words and a tool's output, as they were written
            self.body = QLabel(message["content"])
            self.body.setTextFormat(Qt.TextFormat.PlainText)
            self.body.setWordWrap(True)
            self.body.setTextInteractionFlags(SELECTABLE)
        elif response_format(message) in JSON_FORMATS:
            self.body = JsonView(message["content"])
        else:
            self.body = MarkdownView(message["content"])
        self.column = QVBoxLayout(self.card)
        self.column.setContentsMargins(SPACE_L, 10, SPACE_L - 4, SPACE_L - 2)
        self.column.setSpacing(6)
        self.column.addLayout(self.header)
        self.thinking_block: ThinkingBlock | None = None
        if message.get("reasoning"):  # a card built while the reply still reasons shows it live
            reasoning_ms = (message.get("meta") or {}).get("reasoning_ms")
            self._add_thinking_block(ThinkingBlock(
                message["reasoning"], None if reasoning_ms is None else reasoning_ms / 1e3,
                live=self.message_id is None and not message["content"]))
        self.column.addWidget(self.body)
        # a stored reply that only called tools has no answer text: no empty line between its parts
        self.body.setHidden(self.message_id is not None and not message["content"] and bool(message.get("tool_calls")))
        for call in message.get("tool_calls") or ():  # a reply's calls; each result is the tool card after it
            self.column.addWidget(_call_label(call))
        self.expand_button = self._add_expander()
        self.editor: QWidget | None = None
        self.set_branch_actions_enabled(True)
        for focusable in (self.card, *self.actions_.values()):  # what Tab stops at in the card
            focusable.installEventFilter(self)

    @property
    def message_id(self) -> str | None:
        return self.message["id"]

    @property
    def content(self) -> str:
        return self.message["content"]

    def set_content(self, text: str) -> None:
        """Streaming: the reply so far."""
        self.message = {**self.message, "content": text}
        self.body.setHidden(False)
        if text and self.thinking_block is not None:
            self.thinking_block.finish()
        if isinstance(self.body, MarkdownView):
            self.body.set_markdown(text)
        elif isinstance(self.body, JsonView):
            self.body.set_text(text)
        else:
            self.body.setText(text)

    def set_reasoning(self, reasoning: str) -> None:
        """Streaming: the reasoning so far (the block opens above the answer with its first text)."""
        self.message = {**self.message, "reasoning": reasoning}
        if self.thinking_block is None:
            self._add_thinking_block(ThinkingBlock(reasoning, live=True))
        else:
            self.thinking_block.set_text(reasoning)

    def _add_thinking_block(self, block: ThinkingBlock) -> None:
        self.thinking_block = block
        self.column.insertWidget(1, block)  # under the header, above the answer

    def tab_stops(self) -> list[QWidget]:
        """What Tab stops at in the card, in the order shown: the card, its buttons (a code block's Copy too)."""
        return [w for w in (self.card, *self.card.findChildren(QWidget)) if w.focusPolicy() & Qt.FocusPolicy.TabFocus]

    def set_found(self, found: bool) -> None:
        """Outline the card in the accent colour: the message a search led to."""
        self.card.setProperty("found", found)
        repolish(self.card)

    # -- header ------------------------------------------------------------------------------------
    def _add_switcher(self) -> None:
        if len(self.siblings) < 2 or self.message_id not in self.siblings:
            return
        index = self.siblings.index(self.message_id)
        self.previous_button = back = IconButton("chevron-left", "Previous alternative",
                                                 "Show the previous alternative")
        self.next_button = forward = IconButton("chevron-right", "Next alternative", "Show the next alternative")
        self.position_label = QLabel(f"{index + 1}/{len(self.siblings)}")
        self.position_label.setAccessibleName("Alternative")
        self.position_label.setProperty("tone", "muted")
        back.clicked.connect(lambda: self.switch_requested.emit(self.siblings[index - 1]))
        forward.clicked.connect(lambda: self.switch_requested.emit(self.siblings[index + 1]))
        for widget in (back, self.position_label, forward):
            self.header.addWidget(widget)

    def _add_stopped_mark(self) -> QLabel | None:
        if not is_stopped(self.message):
            return None
        mark = self._mark("stopped", "Stopped reply", "You stopped this reply before it was finished")
        mark.setObjectName("stoppedMark")
        return mark

    def _add_closing_marks(self) -> list[QLabel]:
        """A constrained reply closed at its length limit, and the schema keywords it breaks (checked after it
        was written), each a mark in the header whose tooltip says more."""
        meta = self.message.get("meta") or {}
        marks = []
        if meta.get("finish_reason") == "length_closed":
            marks.append(self._mark("closed at the length limit", "Reply closed at its length limit",
                                    "The reply reached its length limit and was closed early, as a whole, "
                                    "valid document"))
        warnings = meta.get("schema_warnings") or []
        if warnings:
            count = f"{len(warnings)} schema warning{'s' * (len(warnings) != 1)}"
            marks.append(self._mark(count, count, "Checked after the reply (not enforced while writing):\n"
                                    + "\n".join(warnings)))
        return marks

    def _mark(self, text: str, name: str, tip: str) -> QLabel:
        mark = QLabel(text)
        mark.setObjectName("replyMark")
        mark.setAccessibleName(name)
        mark.setToolTip(tip)
        self.header.addWidget(mark)
        return mark

    def _add_actions(self, is_last: bool) -> None:
        self.actions_: dict[str, IconButton] = {}  # trailing underscore: QWidget.actions() is taken
        specs = [("copy", "copy", "Copy message", "Copy this message as Markdown")]
        if self.role == "assistant" and is_last:
            specs.append(("regenerate", "regenerate", "Regenerate reply", "Write another reply in its place"))
        elif self.role == "user" and is_last:
            specs.append(("regenerate", "answer", "Answer message", "Write a reply to this message"))
        if self.role == "user":
            specs.append(("edit", "edit", "Edit message", "Edit and resend; the original stays as an alternative"))
        specs.append(("delete", "delete", "Delete message", "Delete this message and everything after it"))
        self.action_bar = QWidget()
        row = QHBoxLayout(self.action_bar)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        for key, icon_name, accessible, tip in specs:
            button = IconButton(icon_name, accessible, tip)
            row.addWidget(button)
            self.actions_[key] = button
        # Faded out rather than hidden: hidden buttons would drop out of the Tab order and the layout.
        self._fade = QGraphicsOpacityEffect(self.action_bar)
        self.action_bar.setGraphicsEffect(self._fade)
        self.set_actions_revealed(False)
        self.header.addWidget(self.action_bar)
        self.actions_["copy"].clicked.connect(lambda: QGuiApplication.clipboard().setText(self.content))
        if "regenerate" in self.actions_:
            self.actions_["regenerate"].clicked.connect(self.regenerate_requested)
        if "edit" in self.actions_:
            self.actions_["edit"].clicked.connect(self.start_editing)
        self.actions_["delete"].clicked.connect(lambda: self.delete_requested.emit(self.message_id))

    # -- revealing the actions -----------------------------------------------------------------------
    def set_actions_revealed(self, revealed: bool) -> None:
        self._fade.setOpacity(1.0 if revealed else 0.0)

    def _update_revealed(self) -> None:
        focus = QApplication.focusWidget()
        self.set_actions_revealed(self.underMouse() or (focus is not None and self.isAncestorOf(focus)))

    def enterEvent(self, event: QEvent) -> None:
        self.set_actions_revealed(True)
        super().enterEvent(event)

    def leaveEvent(self, event: QEvent) -> None:
        self._update_revealed()
        super().leaveEvent(event)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() in (QEvent.Type.FocusIn, QEvent.Type.FocusOut):
            self._update_revealed()  # Qt has moved the focus already when it sends both events
        return False

    # -- long messages -----------------------------------------------------------------------------
    def _add_expander(self) -> IconButton | None:
        if self.message_id is None or not is_long(self.content):  # a reply being written stays open
            return None
        button = IconButton("chevron-down", "Show more", "Show the whole message", text="Show more")
        button.clicked.connect(lambda: self.set_collapsed(not self.collapsed))
        self.column.addWidget(button, 0, Qt.AlignmentFlag.AlignLeft)
        self.set_collapsed(True, button)
        return button

    def set_collapsed(self, collapsed: bool, button: IconButton | None = None) -> None:
        button = button or self.expand_button
        self.collapsed = collapsed
        self.body.setMaximumHeight(COLLAPSED_HEIGHT_PX if collapsed else 16_777_215)  # QWIDGETSIZE_MAX
        words = ("Show more", "Show the whole message") if collapsed else ("Show less", "Fold the message")
        button.setText(words[0])
        button.setAccessibleName(words[0])
        button.setToolTip(words[1])
        button.set_icon_name("chevron-down" if collapsed else "chevron-up")

    # -- actions -------------------------------------------------------------------------------------
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
        self.save_edit_button.setProperty("accent", True)
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
