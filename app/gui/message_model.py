"""The chat's item model: one row per message of the active branch (root to leaf), the reply being written
included, and the one record of whether a reply is being written.

Changes are as small as what changed: a reply's streamed text is a dataChanged on its row; sending adds the
new rows after the kept ones; the store's version of a branch that changed at its end (an edit, a delete, a
regenerated or switched alternative, a finished turn) replaces only the rows after the unchanged leading
ones; only another conversation resets the model. Rows are store message dicts; a row not stored yet (the
message just sent, the reply being written) has an `id` of None. The alternatives of a row are read from
the store when first asked for, so a long conversation opens without reading the tree."""

from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt, Signal

MESSAGE_ROLE = Qt.ItemDataRole.UserRole          # the whole row (a store message dict)
ID_ROLE = Qt.ItemDataRole.UserRole + 1           # the message's id, None while not stored
AUTHOR_ROLE = Qt.ItemDataRole.UserRole + 2       # "user", "assistant" or "system"
CONTENT_ROLE = Qt.ItemDataRole.UserRole + 3      # its text (also the display role)
SIBLINGS_ROLE = Qt.ItemDataRole.UserRole + 4     # ids of the alternatives at its place, itself included
POSITION_ROLE = Qt.ItemDataRole.UserRole + 5     # (its index among them, how many), (0, 1) when alone
STOPPED_ROLE = Qt.ItemDataRole.UserRole + 6      # a reply the user stopped before it finished
FORMAT_ROLE = Qt.ItemDataRole.UserRole + 7       # the response format's kind a reply follows (None: free text)
STREAMING_ROLE = Qt.ItemDataRole.UserRole + 8    # the reply being written right now
REASONING_ROLE = Qt.ItemDataRole.UserRole + 9    # a reply's reasoning ("" when it has none)
TEXT_ROLES = [CONTENT_ROLE, Qt.ItemDataRole.DisplayRole]  # what a streamed piece of text changes


def is_stopped(message: dict) -> bool:
    return (message.get("meta") or {}).get("finish_reason") == "cancelled"


def response_format(message: dict) -> str | None:
    return (message.get("meta") or {}).get("response_format")


class MessageModel(QAbstractListModel):
    streaming_changed = Signal(bool)  # a reply began or ended: actions that change the tree wait meanwhile

    def __init__(self, siblings_of: Callable[[str], list[str]]):
        """`siblings_of(message_id)` reads the ids of a stored message's alternatives."""
        super().__init__()
        self._siblings_of = siblings_of
        self._rows: list[dict] = []
        self._siblings: dict[str, list[str]] = {}  # read once per message while its row is shown
        self._reply_row: int | None = None          # the row of the reply being written, if one is

    # -- reading -----------------------------------------------------------------------------------
    @property
    def messages(self) -> list[dict]:
        """The rows, root to leaf (a copy)."""
        return list(self._rows)

    @property
    def streaming(self) -> bool:
        return self._reply_row is not None

    @property
    def reply_row(self) -> int | None:
        return self._reply_row

    def row_of(self, message_id: str) -> int | None:
        return next((i for i, m in enumerate(self._rows) if m["id"] == message_id), None)

    def last_reply_text(self) -> str | None:
        return next((m["content"] for m in reversed(self._rows) if m["role"] == "assistant"), None)

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        message = self._rows[index.row()]
        if role == MESSAGE_ROLE:
            return message
        if role == ID_ROLE:
            return message["id"]
        if role == AUTHOR_ROLE:
            return message["role"]
        if role in (CONTENT_ROLE, Qt.ItemDataRole.DisplayRole):
            return message["content"]
        if role == SIBLINGS_ROLE:
            return self._siblings_at(message)
        if role == POSITION_ROLE:
            siblings = self._siblings_at(message)
            return (siblings.index(message["id"]), len(siblings)) if message["id"] in siblings else (0, 1)
        if role == STOPPED_ROLE:
            return is_stopped(message)
        if role == FORMAT_ROLE:
            return response_format(message)
        if role == STREAMING_ROLE:
            return index.row() == self._reply_row
        if role == REASONING_ROLE:
            return message.get("reasoning") or ""
        return None

    def _siblings_at(self, message: dict) -> list[str]:
        if message["id"] is None:
            return []
        if message["id"] not in self._siblings:
            self._siblings[message["id"]] = self._siblings_of(message["id"])
        return self._siblings[message["id"]]

    # -- the stored branch -------------------------------------------------------------------------
    def show_branch(self, messages: list[dict]) -> None:
        """Show `messages` (root to leaf) as stored. The same conversation changed at its end keeps its
        unchanged leading rows; another conversation (or an empty chat) resets the model."""
        same_conversation = bool(self._rows) and bool(messages) and self._rows[0]["id"] == messages[0]["id"]
        self._siblings.clear()  # an edit, a delete or a new reply may have changed any row's alternatives
        if not same_conversation:
            was_streaming = self.streaming
            if self._rows or messages:
                self.beginResetModel()
                self._rows, self._reply_row = list(messages), None
                self.endResetModel()
            if was_streaming:
                self.streaming_changed.emit(False)
            return
        keep = 0
        for old, new in zip(self._rows, messages):
            if old["id"] != new["id"]:
                break
            if old != new:  # stored again with new meta or text (a reply finished or stopped)
                self._rows[keep] = new
                self.dataChanged.emit(self.index(keep), self.index(keep))
            keep += 1
        self._replace_tail(keep, list(messages[keep:]))

    def clear(self) -> None:
        self.show_branch([])

    def _replace_tail(self, keep: int, rows: list[dict], reply: bool = False) -> None:
        """Rows after the first `keep` become `rows` (the last one the reply being written, if `reply`): the
        old ones removed, the new ones inserted. A reply in progress among the removed rows has ended."""
        was_streaming = self.streaming
        if self._reply_row is not None and self._reply_row >= keep:
            self._reply_row = None
        if keep < len(self._rows):
            self.beginRemoveRows(QModelIndex(), keep, len(self._rows) - 1)
            del self._rows[keep:]
            self.endRemoveRows()
        if rows:
            self.beginInsertRows(QModelIndex(), keep, keep + len(rows) - 1)
            self._rows += rows
            if reply:
                self._reply_row = len(self._rows) - 1  # before the view builds the row's widget
            self.endInsertRows()
        if self.streaming != was_streaming:
            self.streaming_changed.emit(self.streaming)

    # -- a reply in progress -----------------------------------------------------------------------
    def begin_reply(self, keep: int, user_text: str | None = None, format_kind: str | None = None) -> None:
        """A reply is being written after the first `keep` rows, below a new user message if given;
        `format_kind` is the kind of response format it follows (None: free text)."""
        rows = [] if user_text is None else [{"id": None, "role": "user", "content": user_text, "meta": {}}]
        rows.append({"id": None, "role": "assistant", "content": "", "meta": {"response_format": format_kind}})
        self._replace_tail(keep, rows, reply=True)

    def append_reply(self, text: str) -> None:
        if self._reply_row is None or not text:
            return
        row = self._rows[self._reply_row]
        self._rows[self._reply_row] = {**row, "content": row["content"] + text}
        self.dataChanged.emit(self.index(self._reply_row), self.index(self._reply_row), TEXT_ROLES)

    def append_reasoning(self, text: str) -> None:
        if self._reply_row is None or not text:
            return
        row = self._rows[self._reply_row]
        self._rows[self._reply_row] = {**row, "reasoning": row.get("reasoning", "") + text}
        self.dataChanged.emit(self.index(self._reply_row), self.index(self._reply_row), [REASONING_ROLE])

    def end_reply(self) -> None:
        """The reply ended (or was abandoned); its row stays until the store's version replaces it."""
        if self._reply_row is None:
            return
        row, self._reply_row = self._reply_row, None
        self.dataChanged.emit(self.index(row), self.index(row), [STREAMING_ROLE])
        self.streaming_changed.emit(False)
