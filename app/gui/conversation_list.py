"""The sidebar's item models over the history store.

ConversationListModel holds the store's conversations in its order (pinned first, then the most recently
updated), read a page at a time as the view scrolls (canFetchMore / fetchMore), so thousands of them open
at once. A change to one conversation updates, moves, inserts or removes its one row; nothing resets.
SearchResultsModel holds one search's matching titles and message hits. Each row's group (its heading in
the view) is a role, so the headings are drawn by the view's delegate and are not rows."""

from __future__ import annotations

from datetime import date, datetime

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt, Signal

from engine.errors import HistoryError, StoreError
from engine.history.store import HistoryStore

ID_ROLE = Qt.ItemDataRole.UserRole
MESSAGE_ROLE = Qt.ItemDataRole.UserRole + 1
GROUP_ROLE = Qt.ItemDataRole.UserRole + 2
PAGE_SIZE = 100   # conversations read per fetch: more than a tall sidebar shows
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


def conversation_group(conv: dict, today: date) -> str:
    return "Pinned" if conv["pinned"] else date_group(conv["updated_at"], today)


def _order_key(conv: dict) -> tuple[bool, str]:
    """The store's order, descending: pinned first, then by updated_at (ISO times in UTC sort as text)."""
    return conv["pinned"], conv["updated_at"]


class _ConversationRows(QAbstractListModel):
    """Rows of dicts with `id`, `title` and, for a message hit, `message_id` and `snippet`; conversation rows
    are renamed in place (the store is written, then `changed` tells the sidebar)."""

    changed = Signal(str)          # a conversation this model wrote to (renamed)
    storage_failed = Signal(str)   # a rename the disk refused: why

    def __init__(self, store: HistoryStore):
        super().__init__()
        self.store = store
        self.rows: list[dict] = []

    def group(self, row: dict) -> str:
        raise NotImplementedError

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.rows)

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        title = row["title"] or UNTITLED
        if role == Qt.ItemDataRole.DisplayRole:
            return f"{title}\n   {row['snippet']}" if row.get("message_id") else title
        if role == Qt.ItemDataRole.EditRole:
            return row["title"] or ""
        if role == Qt.ItemDataRole.ToolTipRole:
            return title
        if role == ID_ROLE:
            return row["id"]
        if role == MESSAGE_ROLE:
            return row.get("message_id")
        if role in (GROUP_ROLE, Qt.ItemDataRole.AccessibleDescriptionRole):  # the heading, for screen readers too
            return self.group(row)
        return None

    def flags(self, index: QModelIndex | QPersistentModelIndex) -> Qt.ItemFlag:
        flags = super().flags(index)
        if index.isValid() and not self.rows[index.row()].get("message_id"):
            flags |= Qt.ItemFlag.ItemIsEditable
        return flags

    def setData(self, index: QModelIndex | QPersistentModelIndex, value, role: int = Qt.ItemDataRole.EditRole) -> bool:
        title = str(value).strip()
        if role != Qt.ItemDataRole.EditRole or not index.isValid() or not title:
            return False
        conversation_id = self.rows[index.row()]["id"]
        try:
            self.store.rename(conversation_id, title)
        except StoreError as e:  # the window's storage banner says why
            self.storage_failed.emit(str(e))
            return False
        self.changed.emit(conversation_id)
        return True

    def row_of(self, conversation_id: str | None) -> int | None:
        """The row of the conversation itself (not of a message hit in it)."""
        return next((i for i, row in enumerate(self.rows)
                     if row["id"] == conversation_id and not row.get("message_id")), None)


class ConversationListModel(_ConversationRows):
    def __init__(self, store: HistoryStore):
        super().__init__(store)
        self._more = True  # the store may hold conversations after the loaded ones
        self.fetchMore(QModelIndex())

    def group(self, row: dict) -> str:
        return conversation_group(row, date.today())

    def canFetchMore(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> bool:
        return not parent.isValid() and self._more

    def fetchMore(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> None:
        if not self.canFetchMore(parent):
            return
        page = self.store.list_conversations(limit=PAGE_SIZE, offset=len(self.rows))
        self._more = len(page) == PAGE_SIZE
        loaded = {row["id"] for row in self.rows}
        page = [conv for conv in page if conv["id"] not in loaded]  # moved up since its page was read
        if page:
            self.beginInsertRows(QModelIndex(), len(self.rows), len(self.rows) + len(page) - 1)
            self.rows += page
            self.endInsertRows()

    def conversation_changed(self, conversation_id: str) -> None:
        """Show the stored state of one conversation (new, renamed, pinned, written to, or deleted): its row
        is updated in place or moved to its new place in the order, or inserted, or removed."""
        try:
            conv = self.store.get_conversation(conversation_id)
        except HistoryError:
            self.conversation_removed(conversation_id)
            return
        old = self.row_of(conversation_id)
        others = [row for row in self.rows if row["id"] != conversation_id]
        new = next((i for i, row in enumerate(others) if _order_key(row) <= _order_key(conv)), len(others))
        if new == len(others) and self._more:  # below the loaded rows: its page brings it when scrolled to
            self.conversation_removed(conversation_id)
        elif old is None:
            self.beginInsertRows(QModelIndex(), new, new)
            self.rows.insert(new, conv)
            self.endInsertRows()
        else:
            if new != old:
                self.beginMoveRows(QModelIndex(), old, old, QModelIndex(), new + (new > old))
                self.rows.insert(new, self.rows.pop(old))
                self.endMoveRows()
            self.rows[new] = conv
            self.dataChanged.emit(self.index(new), self.index(new))

    def conversation_removed(self, conversation_id: str) -> None:
        row = self.row_of(conversation_id)
        if row is not None:
            self.beginRemoveRows(QModelIndex(), row, row)
            del self.rows[row]
            self.endRemoveRows()


class SearchResultsModel(_ConversationRows):
    """Conversations whose title holds every word of the query, then the messages that match it."""

    def group(self, row: dict) -> str:
        return "Messages" if row.get("message_id") else "Titles"

    def search(self, query: str) -> None:
        words = query.lower().split()
        titled = [c for c in self.store.list_conversations() if all(w in (c["title"] or "").lower() for w in words)]
        hits = self.store.search(query, marks=("", ""))  # a list row shows no mark-up: brackets showed raw
        titles = {c["id"]: c["title"] for c in titled}
        for hit in hits:
            if hit["conversation_id"] not in titles:
                titles[hit["conversation_id"]] = self.store.get_conversation(hit["conversation_id"])["title"]
        self.beginResetModel()
        self.rows = [{"id": c["id"], "title": c["title"]} for c in titled] + [
            {"id": hit["conversation_id"], "title": titles[hit["conversation_id"]], "message_id": hit["message_id"],
             "snippet": " ".join(hit["snippet"].split())} for hit in hits]
        self.endResetModel()
