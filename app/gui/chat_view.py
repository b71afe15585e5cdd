"""The scrolling list of messages in the active branch.

Long conversations stay fast by building widgets only for the newest messages (RENDER_BATCH at a time);
scrolling to the top builds the next older batch, keeping the message under the reader's eyes still.
While a reply streams the view follows the bottom only if the reader is already there, so reading
further up never jumps.
"""

from __future__ import annotations

from typing import Callable

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QAbstractSlider, QHBoxLayout, QScrollArea, QVBoxLayout, QWidget
from shiboken6 import isValid

from app.gui.message_widget import MessageWidget
from app.gui.theme import SPACE_L, SPACE_XL, centred
from app.gui.thinking_indicator import ThinkingIndicator

RENDER_BATCH = 40
FOLLOW_SLACK_PX = 24
FOUND_HIGHLIGHT_MS = 3000  # how long a message found by search stays highlighted


class ChatView(QScrollArea):
    regenerate_requested = Signal()
    edit_requested = Signal(str, str)
    delete_requested = Signal(str)
    switch_requested = Signal(str)
    shown_changed = Signal()  # messages appeared or went: the window shows the welcome screen when none

    def __init__(self, siblings_of: Callable[[str], list[str]]):
        super().__init__()
        self._siblings_of = siblings_of
        self.setWidgetResizable(True)
        self.setAccessibleName("Conversation")
        container = QWidget()
        container.setObjectName("chatPane")
        column = QWidget()  # the messages, in a centred column of a readable width
        column.setObjectName("chatColumn")
        for pane in (container, column):
            pane.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)  # painted by the style sheet
        centring = QHBoxLayout(container)
        centring.setContentsMargins(SPACE_XL, SPACE_L, SPACE_XL - 6, SPACE_L)
        centred(column, centring)
        self._column = QVBoxLayout(column)
        self._column.setContentsMargins(0, 0, 0, 0)
        self._column.setSpacing(SPACE_L)
        self._column.addStretch()
        self.setWidget(container)
        self.messages: list[dict] = []
        self.widgets: list[MessageWidget] = []   # for messages[self._first:], then any pending ones
        # The one record of a reply in progress (the window reads it): the widget it streams into, the
        # thinking mark shown in it until its first text, and whether one streams (branch-changing actions
        # wait meanwhile).
        self.streaming: MessageWidget | None = None
        self.thinking: ThinkingIndicator | None = None
        self.busy = False
        self._first = 0
        self._follow = True
        self._anchor: int | None = None  # distance from the bottom to keep while older messages load
        self._target: MessageWidget | None = None  # a message to keep in view while the layout settles
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._scrolled)
        bar.rangeChanged.connect(self._range_changed)
        bar.actionTriggered.connect(self._user_scrolled)

    # -- showing a branch ----------------------------------------------------------------------------
    def show_messages(self, messages: list[dict]) -> None:
        """Show `messages` (root to leaf), keeping the widgets of the unchanged leading messages."""
        keep = 0
        for old, new in zip(self.messages[self._first:], messages[self._first:]):
            if (old["id"], old["content"]) != (new["id"], new["content"]):
                break
            keep += 1
        continuing = (bool(self.messages) and bool(messages) and messages[0]["id"] == self.messages[0]["id"]
                      and self._first < len(messages))  # the same conversation, changed at its end
        if not continuing:
            keep, self._first = 0, max(0, len(messages) - RENDER_BATCH)
        self._truncate(keep)
        self.messages = list(messages)
        for message in messages[self._first + keep:]:
            self._append(message)
        self._mark_last_message()
        self.shown_changed.emit()

    def clear(self) -> None:
        self._follow, self._target = True, None
        self._first = 0
        self._truncate(0)
        self.messages = []
        self.shown_changed.emit()

    def _make(self, message: dict, is_last: bool = False) -> MessageWidget:
        siblings = self._siblings_of(message["id"]) if message["id"] else []
        widget = MessageWidget(message, siblings, is_last=is_last)
        widget.set_branch_actions_enabled(not self.busy)
        widget.regenerate_requested.connect(self.regenerate_requested)
        widget.edit_requested.connect(self.edit_requested)
        widget.delete_requested.connect(self.delete_requested)
        widget.switch_requested.connect(self.switch_requested)
        return widget

    def _append(self, message: dict) -> MessageWidget:
        widget = self._make(message)
        self.widgets.append(widget)
        self._column.insertWidget(self._column.count() - 1, widget)  # above the trailing stretch
        return widget

    def _truncate(self, count: int) -> None:
        if self._target in self.widgets[count:]:
            self._target = None
        for widget in self.widgets[count:]:
            self._column.removeWidget(widget)
            widget.deleteLater()
        del self.widgets[count:]

    def _mark_last_message(self) -> None:
        """Only the last message offers a new reply (Regenerate, or Answer on a user message left without
        one by a stopped reply); rebuild the one or two widgets whose place in that changed."""
        last = len(self.messages) - 1
        for i, widget in enumerate(self.widgets):
            want = i + self._first == last and widget.message_id is not None
            if want != ("regenerate" in widget.actions_):
                replacement = self._make(widget.message, is_last=want)
                self._column.replaceWidget(widget, replacement)
                widget.deleteLater()
                self.widgets[i] = replacement

    # -- a reply in progress ---------------------------------------------------------------------
    def _set_busy(self, busy: bool) -> None:
        self.busy = busy
        if not busy:
            self._stop_thinking()  # a turn that ended without text
        for widget in self.widgets:
            widget.set_branch_actions_enabled(not busy)

    def begin_reply(self, keep: int, user_text: str | None = None, response_format: str | None = None) -> None:
        """Show a reply being written after the first `keep` messages, below a new user message if given;
        `response_format` is the kind of format the reply follows (None: free text)."""
        self._set_busy(True)
        keep = max(keep, self._first)
        self._truncate(keep - self._first)
        self.messages = self.messages[:keep]
        if user_text is not None:
            self._append({"id": None, "role": "user", "content": user_text})
        self.streaming = self._append({"id": None, "role": "assistant", "content": "",
                                       "meta": {"response_format": response_format}})
        self._stop_thinking()
        self.thinking = ThinkingIndicator(self.streaming)
        self.streaming.layout().addWidget(self.thinking)
        self.scroll_to_bottom()
        self.shown_changed.emit()

    def end_reply(self) -> None:
        """The reply ended (or was abandoned); the store's version replaces it when the window refreshes."""
        self.streaming = None
        self._set_busy(False)

    def append_reply(self, text: str) -> None:
        self._anchor = None  # from here on the page grows below the view, which then stays put
        if text:
            self._stop_thinking()
        self.streaming.set_content(self.streaming.content + text)

    def _stop_thinking(self) -> None:
        if self.thinking is not None and isValid(self.thinking):  # not gone with a reply widget cleared away
            self.thinking.hide()
            self.thinking.deleteLater()
        self.thinking = None

    def last_reply_text(self) -> str | None:
        replies = [w for w in self.widgets if w.role == "assistant"]
        return replies[-1].content if replies else None

    # -- scrolling ---------------------------------------------------------------------------------
    def scroll_to_bottom(self) -> None:
        self._follow, self._anchor, self._target = True, None, None
        self.verticalScrollBar().setValue(self.verticalScrollBar().maximum())

    def scroll_to_message(self, message_id: str) -> MessageWidget | None:
        index = next((i for i, m in enumerate(self.messages) if m["id"] == message_id), None)
        if index is None:
            return None
        while index < self._first:
            self._load_older()
        widget = self.widgets[index - self._first]
        self._follow, self._anchor, self._target = False, None, widget
        self._show_target()
        QTimer.singleShot(0, self._show_target)
        self._highlight(widget)
        return widget

    def _show_target(self) -> None:
        """A chat just opened has no geometry yet (scrolling then left it at the top): every range change
        until the reader scrolls brings the target back into view."""
        if self._target is not None:
            self.ensureWidgetVisible(self._target, 0, 40)

    @staticmethod
    def _highlight(widget: MessageWidget) -> None:
        """Outline a found message for a moment."""
        widget.set_found(True)
        timer = QTimer(widget, singleShot=True, interval=FOUND_HIGHLIGHT_MS)  # dies with the widget
        timer.timeout.connect(lambda: widget.set_found(False))
        timer.start()

    def _load_older(self) -> None:
        if self._first == 0:
            return
        start = max(0, self._first - RENDER_BATCH)
        bar = self.verticalScrollBar()
        # Older messages grow the page above the view: holding the distance to the bottom holds the view.
        self._anchor = bar.maximum() - bar.value()
        older = [self._make(m) for m in self.messages[start:self._first]]
        for i, widget in enumerate(older):
            self._column.insertWidget(i, widget)
        self.widgets[:0] = older
        self._first = start

    def _scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._follow = value >= bar.maximum() - FOLLOW_SLACK_PX
        if value == bar.minimum() and self._first > 0 and self._anchor is None:
            self._load_older()

    def _user_scrolled(self, action: int) -> None:
        if action != QAbstractSlider.SliderAction.SliderNoAction:
            self._anchor = self._target = None

    def _range_changed(self, _minimum: int, maximum: int) -> None:
        bar = self.verticalScrollBar()
        if self._target is not None:
            self._show_target()
        elif self._follow:
            bar.setValue(maximum)
        elif self._anchor is not None:
            bar.setValue(maximum - self._anchor)
        if maximum == 0 and self._first > 0:  # the rendered messages do not fill the view yet
            self._load_older()
