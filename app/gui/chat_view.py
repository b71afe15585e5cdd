"""The scrolling chat: a view over the MessageModel (app.gui.message_model) that shows each row as a message
card (app.gui.message_widget).

Cards are real widgets (selectable text, Markdown, hover and Tab-reachable actions, in-place editing), so
they are built only for a window of rows near the view: a conversation opens with its newest RENDER_BATCH
messages; reaching the top builds the next older batch, a jump to a message far away (a search hit) builds
a batch around it, and reaching the bottom of a window up in the history builds the next newer batch. At
most MAX_CARDS exist: building a batch past that drops one at the far end. Through each of these the card
under the reader's eyes stays where it is. The view follows the model's signals: a reset rebuilds the
window, inserted and removed rows add and drop the cards they concern, a row's streamed text updates its
one card. While a reply streams the view follows the bottom only if the reader is already there, so
reading further up never jumps.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QModelIndex, QObject, QPoint, Qt, QTimer, Signal
from PySide6.QtWidgets import QAbstractSlider, QHBoxLayout, QScrollArea, QVBoxLayout, QWidget
from shiboken6 import isValid

from app.gui.message_model import (CONTENT_ROLE, MESSAGE_ROLE, REASONING_ROLE, SIBLINGS_ROLE, STREAMING_ROLE,
                                   TEXT_ROLES, MessageModel)
from app.gui.message_widget import MessageWidget
from app.gui.theme import SPACE_L, SPACE_XL, centred
from app.gui.thinking_indicator import ThinkingIndicator

RENDER_BATCH = 40
MAX_CARDS = 3 * RENDER_BATCH  # beyond this, building a batch drops one at the window's far end
FOLLOW_SLACK_PX = 24
FOUND_HIGHLIGHT_MS = 3000  # how long a message found by search stays highlighted


class ChatView(QScrollArea):
    regenerate_requested = Signal()
    edit_requested = Signal(str, str)
    delete_requested = Signal(str)
    switch_requested = Signal(str)

    def __init__(self, model: MessageModel):
        super().__init__()
        self.model = model
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
        self.widgets: list[MessageWidget] = []   # the cards of rows [self._first, self._last)
        self._first = 0  # the row of widgets[0]
        self.thinking: ThinkingIndicator | None = None  # shown in an empty reply being written
        self._wait: str | None = None  # what that reply waits for, which its thinking mark says
        self._follow = True
        # A card to hold at its place in the view (and that place) while cards are built or dropped around it
        self._anchor: tuple[MessageWidget, int] | None = None
        self._target: MessageWidget | None = None  # a message to keep in view while the layout settles
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._scrolled)
        bar.rangeChanged.connect(self._range_changed)
        bar.actionTriggered.connect(self._user_scrolled)
        model.modelReset.connect(self.rebuild)
        model.rowsInserted.connect(self._rows_inserted)
        model.rowsRemoved.connect(self._rows_removed)
        model.dataChanged.connect(self._data_changed)
        model.streaming_changed.connect(self._streaming_changed)
        self.rebuild()

    @property
    def _last(self) -> int:
        """The row after the window's last card."""
        return self._first + len(self.widgets)

    # -- the window of built cards -------------------------------------------------------------------
    def rebuild(self) -> None:
        """Cards for the newest rows, built afresh (another conversation, or another theme), at the bottom."""
        count = self.model.rowCount()
        self._show_window(max(0, count - RENDER_BATCH), count)
        self._follow = True

    def _show_window(self, first: int, last: int) -> None:
        self._anchor = self._target = None
        self._drop(0, len(self.widgets))
        self._first = first
        self._build(first, last)

    def _build(self, start: int, end: int) -> None:
        """Cards for rows [start, end), which adjoin the window (before its first row or after its last)."""
        at = 0 if end == self._first and self.widgets else len(self.widgets)
        cards = [self._make(row) for row in range(start, end)]
        for i, widget in enumerate(cards):
            self._column.insertWidget(at + i, widget)
        self.widgets[at:at] = cards
        self._keep_tab_order(at, len(cards))
        self._first = min(self._first, start)
        self._sync_thinking()

    def _keep_tab_order(self, at: int, count: int) -> None:
        """New cards join the end of the window's focus chain: put widgets[at:at + count] where they are
        shown, so Tab walks the cards and their buttons in the chat's order."""
        if count == 0 or len(self.widgets) == count:  # a fresh window: built in order
            return
        if at > 0:
            previous = self.widgets[at - 1].tab_stops()[-1]
        else:
            previous = self.widgets[count].previousInFocusChain()  # what Tab reached before the old top card
            while not previous.focusPolicy() & Qt.FocusPolicy.TabFocus:
                previous = previous.previousInFocusChain()
        stops = [stop for card in self.widgets[at:at + count] for stop in card.tab_stops()]
        for first, second in zip([previous, *stops], stops):
            QWidget.setTabOrder(first, second)  # one at a time: Qt moves a compound widget without its children

    def _drop(self, at: int, count: int) -> None:
        """Drop the cards widgets[at:at + count]."""
        gone = self.widgets[at:at + count]
        if self._target in gone:
            self._target = None
        if self._anchor is not None and self._anchor[0] in gone:
            self._anchor = None
        for widget in gone:
            self._column.removeWidget(widget)
            widget.deleteLater()
        del self.widgets[at:at + count]

    def _make(self, row: int) -> MessageWidget:
        index = self.model.index(row)
        message = index.data(MESSAGE_ROLE)
        is_last = row == self.model.rowCount() - 1 and message["id"] is not None
        widget = MessageWidget(message, index.data(SIBLINGS_ROLE), is_last=is_last)
        widget.set_branch_actions_enabled(not self.model.streaming)
        widget.regenerate_requested.connect(self.regenerate_requested)
        widget.edit_requested.connect(self.edit_requested)
        widget.delete_requested.connect(self.delete_requested)
        widget.switch_requested.connect(self.switch_requested)
        return widget

    def _remake(self, row: int) -> None:
        i = row - self._first
        replacement = self._make(row)
        self._column.replaceWidget(self.widgets[i], replacement)
        self.widgets[i].deleteLater()
        if self._target is self.widgets[i]:
            self._target = replacement
        if self._anchor is not None and self._anchor[0] is self.widgets[i]:
            self._anchor = None
        self.widgets[i] = replacement
        self._keep_tab_order(i, 1)

    def _mark_last_message(self) -> None:
        """Only the last message offers a new reply (Regenerate, or Answer on a user message left without
        one by a stopped reply); rebuild the one or two cards whose place in that changed."""
        last = self.model.rowCount() - 1
        for i, widget in enumerate(self.widgets):
            want = i + self._first == last and widget.message_id is not None
            if want != ("regenerate" in widget.actions_):
                self._remake(i + self._first)

    # -- the model's signals -----------------------------------------------------------------------
    def _rows_inserted(self, _parent: QModelIndex, start: int, end: int) -> None:
        count = end - start + 1
        if start < self._first or (start == self._first and self._first < self._last):
            self._first += count  # above the window: not built
        elif start <= self._last:  # in the window or right after it: the window ends with (a batch of) them
            self._drop(start - self._first, self._last - start)  # cards below them (none when appended)
            self._build(start, min(end + 1, start + RENDER_BATCH))
        self._mark_last_message()

    def _rows_removed(self, _parent: QModelIndex, start: int, end: int) -> None:
        shown_from, shown_to = max(start, self._first), min(end + 1, self._last)
        if shown_from < shown_to:
            self._drop(shown_from - self._first, shown_to - shown_from)
        before = max(0, min(end + 1, self._first) - start)  # removed rows above the window
        self._first -= before
        if not self.widgets and self.model.rowCount():  # the window went: the rows up to where it was
            self._first = min(start, self.model.rowCount())
            self._build(max(0, self._first - RENDER_BATCH), self._first)
        self._mark_last_message()
        self._sync_thinking()

    def _data_changed(self, top: QModelIndex, bottom: QModelIndex, roles: list[int]) -> None:
        for row in range(max(top.row(), self._first), min(bottom.row() + 1, self._last)):
            if roles and set(roles) <= set(TEXT_ROLES):  # streamed text: the card follows it in place
                self.widgets[row - self._first].set_content(self.model.index(row).data(CONTENT_ROLE))
            elif roles == [REASONING_ROLE]:  # streamed reasoning, likewise
                self.widgets[row - self._first].set_reasoning(self.model.index(row).data(REASONING_ROLE))
            elif roles != [STREAMING_ROLE]:  # stored anew (a finished or stopped reply): a card of its new state
                self._remake(row)
        self._sync_thinking()

    def _streaming_changed(self, streaming: bool) -> None:
        for widget in self.widgets:
            widget.set_branch_actions_enabled(not streaming)
        if streaming:
            self.scroll_to_bottom()
        else:
            self._wait = None
        self._sync_thinking()

    def show_wait(self, text: str | None) -> None:
        """Say in the reply being written what it waits for (None: it is thinking)."""
        self._wait = text
        if self.thinking is not None and isValid(self.thinking):
            self.thinking.set_wait(text)

    def reasoning_ended(self, *_) -> None:
        """The reply being written stopped reasoning with no answer text to say so (it calls a tool, whose
        markup is not shown): its thinking block says how long it thought."""
        row = self.model.reply_row
        if row is not None and self._first <= row < self._last:
            block = self.widgets[row - self._first].thinking_block
            if block is not None:
                block.finish()

    def _sync_thinking(self) -> None:
        """The thinking mark sits in the card of the reply being written until its first text (reasoning,
        whose own block then says it thinks, or answer)."""
        row, widget = self.model.reply_row, None
        index = self.model.index(row) if row is not None else None
        if (index is not None and self._first <= row < self._last and not index.data(CONTENT_ROLE)
                and not index.data(REASONING_ROLE)):
            widget = self.widgets[row - self._first]
        card = widget and widget.card
        if self.thinking is not None and isValid(self.thinking) and self.thinking.parent() is card:
            return
        if self.thinking is not None and isValid(self.thinking):  # not gone with a card dropped
            self.thinking.hide()
            self.thinking.deleteLater()
        self.thinking = None
        if widget is not None:  # under the card's heading, where its text will be
            self.thinking = ThinkingIndicator(card)
            self.thinking.set_wait(self._wait)
            widget.column.addWidget(self.thinking)

    # -- scrolling ---------------------------------------------------------------------------------
    def scroll_to_bottom(self) -> None:
        count = self.model.rowCount()
        if not self._shows_the_end():  # the window is up in the history: the newest rows instead
            self._show_window(max(0, count - RENDER_BATCH), count)
        self._follow, self._anchor, self._target = True, None, None
        self.verticalScrollBar().setValue(self.verticalScrollBar().maximum())

    def scroll_to_message(self, message_id: str) -> MessageWidget | None:
        row = self.model.row_of(message_id)
        if row is None:
            return None
        if not self._first <= row < self._last:  # a batch around it, newer ones built as the reader scrolls
            first = max(0, row - RENDER_BATCH // 2)
            self._show_window(first, min(self.model.rowCount(), first + RENDER_BATCH))
        widget = self.widgets[row - self._first]
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
        self._hold_view()
        self._build(max(0, self._first - RENDER_BATCH), self._first)
        if len(self.widgets) > MAX_CARDS:  # the newest, far below the view
            self._drop(MAX_CARDS, len(self.widgets) - MAX_CARDS)

    def _load_newer(self) -> None:
        if self._shows_the_end():
            return
        self._hold_view()
        self._build(self._last, min(self.model.rowCount(), self._last + RENDER_BATCH))
        if len(self.widgets) > MAX_CARDS:  # the oldest, far above the view
            dropped = len(self.widgets) - MAX_CARDS
            self._drop(0, dropped)
            self._first += dropped

    def _page_y(self, widget: QWidget) -> int:
        return widget.mapTo(self.widget(), QPoint(0, 0)).y()

    def _hold_view(self) -> None:
        """Cards built or dropped above the view would move what the reader sees: hold the card at the top
        of the view where it is until the layout settles (or the reader scrolls)."""
        top = self.verticalScrollBar().value()
        card = next((w for w in self.widgets if self._page_y(w) + w.height() > top), None)
        if card is not None:
            self._anchor = (card, self._page_y(card) - top)
            card.installEventFilter(self)  # it moves when the cards above it are laid out

    def _apply_anchor(self) -> None:
        card, offset = self._anchor
        self.verticalScrollBar().setValue(self._page_y(card) - offset)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Move and self._anchor is not None and watched is self._anchor[0]:
            self._apply_anchor()
        return False

    def _scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        at_bottom = value >= bar.maximum() - FOLLOW_SLACK_PX
        self._follow = at_bottom and self._anchor is None  # a held view may touch the bottom of a page still growing
        if self._anchor is not None or self._target is not None:  # a view being held: build nothing more yet
            return
        if value == bar.minimum() and self._first > 0:
            self._load_older()
        elif at_bottom and not self._shows_the_end():
            self._load_newer()

    def _shows_the_end(self) -> bool:
        """The window reaches the newest message (only then is there a bottom to follow)."""
        return self._last == self.model.rowCount()

    def _user_scrolled(self, action: int) -> None:
        if action != QAbstractSlider.SliderAction.SliderNoAction:
            self._anchor = self._target = None

    def _range_changed(self, _minimum: int, maximum: int) -> None:
        bar = self.verticalScrollBar()
        if self._target is not None:
            self._show_target()
        elif self._follow and self._shows_the_end():
            bar.setValue(maximum)
        elif self._anchor is not None:
            self._apply_anchor()
        if maximum == 0:  # the built cards do not fill the view yet
            if self._first > 0:
                self._load_older()
            else:
                self._load_newer()

