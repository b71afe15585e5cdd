"""The conversation list: grouped by date with pinned ones first, a search box (titles and message text),
and new / rename / pin / export / delete. A QListView over the item models of app.gui.conversation_list,
which read the UI thread's own HistoryStore connection a page at a time; the window tells the sidebar
which conversation changed, and only that row changes. Changes that touch an open conversation's engine
state (deleting it) go through the main window to the worker."""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, QRect, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QFont, QFontMetrics, QPainter, QPalette
from PySide6.QtWidgets import (QAbstractItemView, QLabel, QLineEdit, QListView, QMenu, QMessageBox, QPushButton,
                               QStyledItemDelegate, QStyleOptionViewItem, QVBoxLayout, QWidget)

from app.gui.conversation_list import (GROUP_ROLE, ID_ROLE, MESSAGE_ROLE, UNTITLED, ConversationListModel,
                                       SearchResultsModel)
from engine.errors import StoreError
from engine.history.store import HistoryStore

SEARCH_DELAY_MS = 150
HEADING_PADDING_PX = 10


class GroupHeadingDelegate(QStyledItemDelegate):
    """Draws a row's group heading ("Today", "Pinned", "Messages"…) above the first row of each group."""

    def heading(self, index: QModelIndex) -> str | None:
        group = index.data(GROUP_ROLE)
        above = index.siblingAtRow(index.row() - 1).data(GROUP_ROLE) if index.row() else None
        return group if group != above else None

    @staticmethod
    def _heading_font(option: QStyleOptionViewItem) -> QFont:
        font = QFont(option.font)
        font.setBold(True)
        return font

    def _heading_height(self, option: QStyleOptionViewItem, index: QModelIndex) -> int:
        if self.heading(index) is None:
            return 0
        return QFontMetrics(self._heading_font(option)).height() + HEADING_PADDING_PX

    def _item_option(self, option: QStyleOptionViewItem, index: QModelIndex) -> QStyleOptionViewItem:
        item = QStyleOptionViewItem(option)
        item.rect = option.rect.adjusted(0, self._heading_height(option, index), 0, 0)
        return item

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:
        size = super().sizeHint(option, index)
        return QSize(size.width(), size.height() + self._heading_height(option, index))

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        heading = self.heading(index)
        if heading is not None:
            rect = QRect(option.rect)
            rect.setHeight(self._heading_height(option, index))
            painter.save()
            painter.setFont(self._heading_font(option))
            painter.setPen(option.palette.color(QPalette.ColorRole.WindowText))
            painter.drawText(rect.adjusted(4, 0, 0, 0), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignBottom,
                             heading)
            painter.restore()
        super().paint(painter, self._item_option(option, index), index)

    def updateEditorGeometry(self, editor: QWidget, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        super().updateEditorGeometry(editor, self._item_option(option, index), index)


class Sidebar(QWidget):
    conversation_chosen = Signal(str)
    message_chosen = Signal(str, str)        # conversation id, message id (a search hit)
    new_requested = Signal()
    delete_requested = Signal(str)
    export_requested = Signal(str)
    storage_failed = Signal(str)             # a rename or pin the disk refused: why

    def __init__(self, store: HistoryStore):
        super().__init__()
        self.store = store
        self.current_id: str | None = None
        self.conversations = ConversationListModel(store)
        self.results = SearchResultsModel(store)
        self.new_button = QPushButton("New chat")
        self.new_button.setAccessibleName("New chat")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search (Ctrl+K)")
        self.search.setAccessibleName("Search conversations")
        self.search.setClearButtonEnabled(True)
        self.no_matches = QLabel("No matches")
        self.no_matches.hide()
        self.list = QListView()
        self.list.setAccessibleName("Conversations")
        self.list.setItemDelegate(GroupHeadingDelegate(self.list))
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.DoubleClicked
                                  | QAbstractItemView.EditTrigger.EditKeyPressed)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # long titles elide
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setModel(self.conversations)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 10, 10, 10)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.no_matches)
        layout.addWidget(self.list)
        self._search_timer = QTimer(self, singleShot=True, interval=SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(self._show_search)
        self.search.textChanged.connect(self._search_timer.start)
        self.new_button.clicked.connect(self.new_requested)
        self.list.activated.connect(self._activated)
        self.list.clicked.connect(self._activated)
        self.list.customContextMenuRequested.connect(self._context_menu)
        for model in (self.conversations, self.results):
            model.changed.connect(self.conversation_changed)
            model.storage_failed.connect(self.storage_failed)
            # a row's heading depends on the row above: a changed row may add or drop its neighbour's
            model.dataChanged.connect(lambda first, *_: self.list.itemDelegate().sizeHintChanged.emit(first))

    # -- contents ----------------------------------------------------------------------------------
    def conversation_changed(self, conversation_id: str) -> None:
        """One conversation was created, renamed, pinned or written to: its row shows it."""
        self.conversations.conversation_changed(conversation_id)
        if self.search.text().strip():
            self._search_timer.start()  # a search shows it again, as typing does
        self._show_current()

    def conversation_removed(self, conversation_id: str) -> None:
        self.conversations.conversation_removed(conversation_id)
        if self.search.text().strip():
            self._search_timer.start()

    def _show_search(self) -> None:
        query = self.search.text().strip()
        if query:
            self.results.search(query)
        model = self.results if query else self.conversations
        if self.list.model() is not model:
            self.list.setModel(model)
        self.no_matches.setVisible(bool(query) and not self.results.rows)
        self._show_current()

    def select(self, conversation_id: str | None) -> None:
        self.current_id = conversation_id
        if conversation_id is not None and self.conversations.row_of(conversation_id) is None:
            self.conversations.conversation_changed(conversation_id)  # new, imported, or not loaded yet
        self._show_current()

    def _show_current(self) -> None:
        model = self.list.model()
        row = model.row_of(self.current_id)
        if row is None:
            self.list.clearSelection()
            self.list.setCurrentIndex(QModelIndex())
        else:
            self.list.setCurrentIndex(model.index(row))

    def focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    # -- actions -----------------------------------------------------------------------------------
    def _activated(self, index: QModelIndex) -> None:
        conversation_id, message_id = index.data(ID_ROLE), index.data(MESSAGE_ROLE)
        if conversation_id is None:
            return
        if message_id is not None:
            self.message_chosen.emit(conversation_id, message_id)
        elif conversation_id != self.current_id:
            self.conversation_chosen.emit(conversation_id)

    def _context_menu(self, position) -> None:
        index = self.list.indexAt(position)
        conversation_id = index.data(ID_ROLE)
        if not conversation_id:
            return
        pinned = self.store.get_conversation(conversation_id)["pinned"]
        menu = QMenu(self)
        if index.flags() & Qt.ItemFlag.ItemIsEditable:  # a conversation, not a message hit
            menu.addAction("Rename", lambda: self.list.edit(index))
        menu.addAction("Unpin" if pinned else "Pin", lambda: self.set_pinned(conversation_id, not pinned))
        menu.addAction("Export…", lambda: self.export_requested.emit(conversation_id))
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self.confirm_delete(conversation_id))
        menu.exec(self.list.viewport().mapToGlobal(position))

    def set_pinned(self, conversation_id: str, pinned: bool) -> None:
        try:
            self.store.set_pinned(conversation_id, pinned)
        except StoreError as e:  # the window's storage banner says why
            self.storage_failed.emit(str(e))
            return
        self.conversation_changed(conversation_id)

    def confirm_delete(self, conversation_id: str) -> None:
        title = self.store.get_conversation(conversation_id)["title"] or UNTITLED
        answer = QMessageBox.question(self, "Delete conversation",
                                      f"Delete “{title}” and all its messages? This cannot be undone.")
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_requested.emit(conversation_id)
