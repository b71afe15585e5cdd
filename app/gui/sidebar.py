"""The conversation list: grouped by date with pinned ones first, a search box (titles and message text),
and new / rename / pin / export / delete. It reads the UI thread's own HistoryStore connection; changes
that touch an open conversation's engine state (deleting it) go through the main window to the worker."""

from __future__ import annotations

from datetime import date, datetime

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (QLineEdit, QListWidget, QListWidgetItem, QMenu, QMessageBox, QPushButton,
                               QVBoxLayout, QWidget)

from engine.errors import StoreError
from engine.history.store import HistoryStore

ID_ROLE = Qt.ItemDataRole.UserRole
MESSAGE_ROLE = Qt.ItemDataRole.UserRole + 1
SEARCH_DELAY_MS = 150
UNTITLED = "New conversation"


def date_group(updated_at: str, today: date) -> str:
    day = datetime.fromisoformat(updated_at).astimezone().date()
    age = (today - day).days
    if age <= 0:
        return "Today"
    if age == 1:
        return "Yesterday"
    if age < 7:
        return "Previous 7 days"
    if age < 30:
        return "Previous 30 days"
    return "Older"


def group_conversations(conversations: list[dict], today: date) -> list[tuple[str, list[dict]]]:
    """(heading, conversations) in display order: pinned first, then by age (the store's order within)."""
    groups: dict[str, list[dict]] = {}
    for conv in conversations:
        heading = "Pinned" if conv["pinned"] else date_group(conv["updated_at"], today)
        groups.setdefault(heading, []).append(conv)
    return list(groups.items())


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
        self.new_button = QPushButton("New chat")
        self.new_button.setAccessibleName("New chat")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search (Ctrl+K)")
        self.search.setAccessibleName("Search conversations")
        self.search.setClearButtonEnabled(True)
        self.list = QListWidget()
        self.list.setAccessibleName("Conversations")
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # long titles elide
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 10, 10, 10)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.list)
        self._search_timer = QTimer(self, singleShot=True, interval=SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(self.refresh)
        self.search.textChanged.connect(self._search_timer.start)
        self.new_button.clicked.connect(self.new_requested)
        self.list.itemActivated.connect(self._activated)
        self.list.itemClicked.connect(self._activated)
        self.list.itemChanged.connect(self._renamed)
        self.list.customContextMenuRequested.connect(self._context_menu)
        self.refresh()

    # -- contents ----------------------------------------------------------------------------------
    def refresh(self) -> None:
        self.list.blockSignals(True)  # itemChanged is for the user's renames only
        self.list.clear()
        query = self.search.text().strip()
        if query:
            self._show_search(query)
        else:
            for heading, conversations in group_conversations(self.store.list_conversations(), date.today()):
                self._add_heading(heading)
                for conv in conversations:
                    self._add_conversation(conv)
        self.list.blockSignals(False)

    def _add_heading(self, text: str) -> None:
        item = QListWidgetItem(text)
        item.setFlags(Qt.ItemFlag.ItemIsEnabled)  # not selectable, but not greyed out like a disabled item
        font = QFont(self.list.font())
        font.setBold(True)
        item.setFont(font)
        self.list.addItem(item)

    def _add_conversation(self, conv: dict) -> None:
        item = QListWidgetItem(conv["title"] or UNTITLED)
        item.setData(ID_ROLE, conv["id"])
        item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
        item.setToolTip(conv["title"] or UNTITLED)
        self.list.addItem(item)
        if conv["id"] == self.current_id:
            item.setSelected(True)
            self.list.setCurrentItem(item)

    def _show_search(self, query: str) -> None:
        words = query.lower().split()
        conversations = self.store.list_conversations()
        titled = [c for c in conversations if all(w in (c["title"] or "").lower() for w in words)]
        if titled:
            self._add_heading("Titles")
            for conv in titled:
                self._add_conversation(conv)
        hits = self.store.search(query, marks=("", ""))  # a list item shows no mark-up: brackets showed raw
        if hits:
            self._add_heading("Messages")
            titles = {c["id"]: c["title"] or UNTITLED for c in conversations}
            for hit in hits:
                snippet = " ".join(hit["snippet"].split())
                item = QListWidgetItem(f"{titles.get(hit['conversation_id'], UNTITLED)}\n   {snippet}")
                item.setData(ID_ROLE, hit["conversation_id"])
                item.setData(MESSAGE_ROLE, hit["message_id"])
                self.list.addItem(item)
        if not titled and not hits:
            self._add_heading("No matches")

    def select(self, conversation_id: str | None) -> None:
        self.current_id = conversation_id
        self.refresh()

    def focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    # -- actions -----------------------------------------------------------------------------------
    def _activated(self, item: QListWidgetItem) -> None:
        conversation_id, message_id = item.data(ID_ROLE), item.data(MESSAGE_ROLE)
        if conversation_id is None:
            return
        if message_id is not None:
            self.message_chosen.emit(conversation_id, message_id)
        elif conversation_id != self.current_id:
            self.conversation_chosen.emit(conversation_id)

    def _renamed(self, item: QListWidgetItem) -> None:
        title = item.text().strip()
        if item.data(ID_ROLE) and title:
            self._write(lambda: self.store.rename(item.data(ID_ROLE), title))
        self.refresh()

    def _context_menu(self, position) -> None:
        item = self.list.itemAt(position)
        conversation_id = item and item.data(ID_ROLE)
        if not conversation_id:
            return
        pinned = self.store.get_conversation(conversation_id)["pinned"]
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.list.editItem(item))
        menu.addAction("Unpin" if pinned else "Pin", lambda: self.set_pinned(conversation_id, not pinned))
        menu.addAction("Export…", lambda: self.export_requested.emit(conversation_id))
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self.confirm_delete(conversation_id))
        menu.exec(self.list.viewport().mapToGlobal(position))

    def set_pinned(self, conversation_id: str, pinned: bool) -> None:
        self._write(lambda: self.store.set_pinned(conversation_id, pinned))
        self.refresh()

    def _write(self, change) -> None:
        try:
            change()
        except StoreError as e:  # the window's storage banner says why
            self.storage_failed.emit(str(e))

    def confirm_delete(self, conversation_id: str) -> None:
        title = self.store.get_conversation(conversation_id)["title"] or UNTITLED
        answer = QMessageBox.question(self, "Delete conversation",
                                      f"Delete “{title}” and all its messages? This cannot be undone.")
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_requested.emit(conversation_id)
