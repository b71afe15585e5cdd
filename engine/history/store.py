"""The SQLite history store: conversations, message trees, attachments and full-text search.

Messages form a tree (parent_id) so edits and regenerations keep their alternatives; a
conversation's `active_leaf` picks the branch the user sees. The database runs in WAL mode and
every write is one transaction, so killing the process loses at most the write in flight.
"""

import json
import os
import re
import sqlite3
import statistics
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import sqlite_utils

from engine.platform.catalog import model_display_name
from engine.errors import HistoryError
from engine.history.schema import MIGRATIONS
from engine.history.validate import (EXPORT_FORMAT, EXPORT_VERSION, ROLES, check_export, check_sampler, check_text,
                                     check_tool_parts, check_tools)
from engine.platform.paths import data_dir
from engine.platform.storage_errors import storage_error

TITLE_CHARS = 60
_NON_SPACE = re.compile(r"\S")

# "Not passed" marker (keep the setting / use the active leaf), distinct from None, a real value here.
_KEEP = object()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _new_id() -> str:
    return str(uuid.uuid4())


class HistoryStore:
    """Conversations and their message trees in one SQLite file."""

    def __init__(self, path: str | os.PathLike):
        """Raises a StoreError (engine.errors) when the file cannot be created or opened for writing."""
        self.path = Path(path)
        self.db = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite_utils.Database(self.path)
            self.db.enable_wal()
            self.db.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except (sqlite3.Error, OSError) as e:
            if self.db is not None:
                self.db.close()
            raise storage_error(e, self.path) from e

    @staticmethod
    def default_path() -> Path:
        """The data dir's `history.db` (engine.platform.paths)."""
        return data_dir() / "history.db"

    def close(self) -> None:
        self.db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- schema --

    @property
    def schema_version(self) -> int:
        return self.db.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0]

    def _migrate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
        for version in range(self.schema_version + 1, len(MIGRATIONS) + 1):
            MIGRATIONS[version - 1](self.db)
            with self._tx() as conn:
                conn.execute("INSERT INTO schema_version VALUES (?, ?)", (version, _now()))

    @contextmanager
    def _tx(self):
        """One transaction: committed on exit, rolled back on error. A write the disk refuses (full, read-only,
        locked) raises a StoreError and leaves every earlier commit as it was."""
        conn = self.db.conn
        try:
            with conn:
                yield conn
        except sqlite3.Error as e:
            if conn.in_transaction:
                conn.rollback()
            raise storage_error(e, self.path) from e

    # -- conversations --

    def create_conversation(self, model: str, title: str | None = None, system_prompt: str | None = None,
                            sampler: dict | None = None, tools: dict | None = None) -> str:
        """`tools`: its own tool setting (validate.check_tools; None: the app's defaults)."""
        cid, now = _new_id(), _now()
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO conversations (id, title, model, system_prompt, sampler, tools, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (cid, title, model, system_prompt, _sampler_json(sampler), _tools_json(tools), now, now),
            )
        return cid

    def get_conversation(self, conversation_id: str) -> dict:
        rows = list(self.db.query("SELECT * FROM conversations WHERE id = ?", [conversation_id]))
        if not rows:
            raise HistoryError(f"no conversation {conversation_id!r} in {self.path}")
        return _conversation(rows[0])

    def list_conversations(self, limit: int | None = None, offset: int = 0) -> list[dict]:
        """Pinned first, then the most recently updated; `limit` from `offset` on: one page of a long list."""
        return [_conversation(r) for r in self.db.query(
            "SELECT * FROM conversations ORDER BY pinned DESC, updated_at DESC, rowid DESC LIMIT ? OFFSET ?",
            [-1 if limit is None else limit, offset])]

    def decode_speeds(self) -> dict[str, float]:
        """How fast each model has written replies here: the median decode rate (tokens/s) of its stored
        replies, by the name of its model file."""
        rates: dict[str, list[float]] = {}
        for row in self.db.query(
                "SELECT json_extract(meta, '$.model') AS model, json_extract(meta, '$.decode_tps') AS tps"
                " FROM messages WHERE role = 'assistant' AND tps > 0 AND model IS NOT NULL"):
            rates.setdefault(Path(row["model"]).name, []).append(row["tps"])
        return {name: statistics.median(values) for name, values in rates.items()}

    def rename(self, conversation_id: str, title: str) -> None:
        title = check_text(title, "title")
        with self._tx():
            self._update_conversation(conversation_id, title=title)

    def set_pinned(self, conversation_id: str, pinned: bool) -> None:
        with self._tx():
            self._update_conversation(conversation_id, pinned=int(bool(pinned)))

    def update_settings(self, conversation_id: str, *, model=_KEEP, system_prompt=_KEEP, sampler=_KEEP,
                        tools=_KEEP) -> None:
        """Change only the settings passed; None clears system_prompt, sampler or tools (back to the app's
        defaults)."""
        changes = {"model": model, "system_prompt": system_prompt}
        if sampler is not _KEEP:
            changes["sampler"] = _sampler_json(sampler)
        if tools is not _KEEP:
            changes["tools"] = _tools_json(tools)
        with self._tx():
            self._update_conversation(conversation_id, **{k: v for k, v in changes.items() if v is not _KEEP})

    def delete_conversation(self, conversation_id: str) -> None:
        """Deletes its messages and attachments rows too (the files on disk are the caller's)."""
        with self._tx() as conn:
            if not conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,)).rowcount:
                raise HistoryError(f"no conversation {conversation_id!r} in {self.path}")

    def _update_conversation(self, conversation_id: str, **changes) -> None:
        """Runs inside the caller's transaction; every change also bumps updated_at."""
        changes["updated_at"] = _now()
        sets = ", ".join(f"{k} = ?" for k in changes)
        if not self.db.execute(f"UPDATE conversations SET {sets} WHERE id = ?",
                               [*changes.values(), conversation_id]).rowcount:
            raise HistoryError(f"no conversation {conversation_id!r} in {self.path}")

    # -- messages --

    def add_message(self, conversation_id: str, role: str, content: str, parent_id=_KEEP,
                    meta: dict | None = None, reasoning: str = "", tool_calls: list[dict] | None = None,
                    tool_result: dict | None = None) -> str:
        """Append a message under `parent_id` (default: the active leaf; None: a new root) and make it
        the active leaf. The first user message titles an untitled conversation. `reasoning`: what a reply
        reasoned before its answer (`content`); `tool_calls`: the calls a reply made ({id, name, arguments});
        `tool_result`: a tool message's {call_id, name, is_error, seconds} (its content is the result)."""
        if role not in ROLES:
            raise HistoryError(f"message role {role!r} is not one of {', '.join(ROLES)}")
        check_text(content, "message content")
        check_text(reasoning, "message reasoning")
        tool_calls, tool_result = check_tool_parts(role, tool_calls, tool_result, "message")
        mid = _new_id()
        with self._tx() as conn:
            row = conn.execute("SELECT title, active_leaf FROM conversations WHERE id = ?",
                               (conversation_id,)).fetchone()
            if row is None:
                raise HistoryError(f"no conversation {conversation_id!r} in {self.path}")
            title, leaf = row
            parent = leaf if parent_id is _KEEP else parent_id
            if parent is not None:
                self._message_in(conversation_id, parent)
            _insert_message(conn, {"id": mid, "conversation_id": conversation_id, "parent_id": parent, "role": role,
                                   "content": content, "created_at": _now(), "meta": meta or {},
                                   "reasoning": reasoning, "tool_calls": tool_calls, "tool_result": tool_result})
            changes = {"active_leaf": mid}
            if title is None and role == "user" and _NON_SPACE.search(content):
                changes["title"] = _title_from(content)
            self._update_conversation(conversation_id, **changes)
        return mid

    def branch(self, message_id: str, content: str, meta: dict | None = None) -> str:
        """Add an alternative to `message_id` (an edit of a user turn, a regeneration of an assistant
        one): same parent and role. It becomes the active leaf."""
        msg = self.get_message(message_id)
        return self.add_message(msg["conversation_id"], msg["role"], content, parent_id=msg["parent_id"], meta=meta)

    def get_message(self, message_id: str) -> dict:
        rows = list(self.db.query("SELECT * FROM messages WHERE id = ?", [message_id]))
        if not rows:
            raise HistoryError(f"no message {message_id!r} in {self.path}")
        return _message(rows[0])

    def siblings(self, message_id: str) -> list[dict]:
        """The alternatives at this message's place in the tree, oldest first (itself included)."""
        msg = self.get_message(message_id)
        return [_message(r) for r in self.db.query(
            "SELECT * FROM messages WHERE conversation_id = ? AND parent_id IS ? ORDER BY created_at, rowid",
            [msg["conversation_id"], msg["parent_id"]])]

    def set_active_leaf(self, conversation_id: str, message_id: str) -> str:
        """Show the branch through `message_id`, following its newest replies down to a leaf (so
        switching to an alternative user turn shows its answer). Returns the leaf."""
        with self._tx() as conn:
            leaf = self._message_in(conversation_id, message_id)["id"]
            while child := conn.execute(
                    "SELECT id FROM messages WHERE parent_id = ? ORDER BY created_at DESC, rowid DESC LIMIT 1",
                    (leaf,)).fetchone():
                leaf = child[0]
            self._update_conversation(conversation_id, active_leaf=leaf)
        return leaf

    def active_branch(self, conversation_id: str) -> list[dict]:
        """The messages the user sees: root to the active leaf."""
        leaf = self.get_conversation(conversation_id)["active_leaf"]
        # ordered here, not by ORDER BY: SQLite's sorter would copy every message's text (a 200 MB one thrice)
        rows = list(self.db.query(
            """WITH RECURSIVE path(id, depth) AS (
                   SELECT ?, 0
                   UNION ALL SELECT m.parent_id, path.depth + 1 FROM messages m JOIN path ON m.id = path.id
                   WHERE m.parent_id IS NOT NULL)
               SELECT messages.*, depth FROM path JOIN messages USING (id)""",
            [leaf]))
        by_depth = {r.pop("depth"): r for r in rows}
        return [_message(by_depth[d]) for d in sorted(by_depth, reverse=True)]

    def delete_message(self, message_id: str) -> None:
        """Delete a message and everything under it; an active leaf inside it moves to its parent."""
        msg = self.get_message(message_id)
        with self._tx() as conn:
            leaf = conn.execute("SELECT active_leaf FROM conversations WHERE id = ?",
                                (msg["conversation_id"],)).fetchone()[0]
            in_subtree = conn.execute(
                """WITH RECURSIVE sub(id) AS (
                       SELECT ? UNION ALL SELECT m.id FROM messages m JOIN sub ON m.parent_id = sub.id)
                   SELECT 1 FROM sub WHERE id = ?""", (message_id, leaf)).fetchone()
            conn.execute("DELETE FROM messages WHERE id = ?", (message_id,))  # children cascade
            changes = {"active_leaf": msg["parent_id"]} if in_subtree else {}
            self._update_conversation(msg["conversation_id"], **changes)

    def _message_in(self, conversation_id: str, message_id: str) -> dict:
        rows = list(self.db.query("SELECT * FROM messages WHERE id = ? AND conversation_id = ?",
                                  [message_id, conversation_id]))
        if not rows:
            raise HistoryError(f"no message {message_id!r} in conversation {conversation_id!r}")
        return _message(rows[0])

    # -- attachments --

    def add_attachment(self, conversation_id: str, name: str, kind: str, path: str, document: str | None = None,
                       tokens: int | None = None) -> str:
        """`document`: the SHA-256 (hex) of the text read from `path`, which names its cartridge."""
        aid = _new_id()
        with self._tx() as conn:
            self._update_conversation(conversation_id)
            conn.execute("INSERT INTO attachments (id, conversation_id, name, kind, path, created_at, document, tokens)"
                         " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (aid, conversation_id, name, kind, str(path), _now(), document, tokens))
        return aid

    def attachments(self, conversation_id: str) -> list[dict]:
        """In the order they were attached (the order their cartridges are composed in)."""
        return list(self.db.query("SELECT * FROM attachments WHERE conversation_id = ? ORDER BY created_at, rowid",
                                  [conversation_id]))

    def update_attachment(self, attachment_id: str, *, document: str, tokens: int) -> None:
        """Its file was read again (it changed since it was attached)."""
        with self._tx() as conn:
            if not conn.execute("UPDATE attachments SET document = ?, tokens = ? WHERE id = ?",
                                (document, tokens, attachment_id)).rowcount:
                raise HistoryError(f"no attachment {attachment_id!r} in {self.path}")

    def remove_attachment(self, attachment_id: str) -> None:
        with self._tx() as conn:
            row = conn.execute("SELECT conversation_id FROM attachments WHERE id = ?", (attachment_id,)).fetchone()
            if row is None:
                raise HistoryError(f"no attachment {attachment_id!r} in {self.path}")
            conn.execute("DELETE FROM attachments WHERE id = ?", (attachment_id,))
            self._update_conversation(row[0])

    # -- search --

    def search(self, query: str, limit: int = 50, marks: tuple[str, str] = ("[", "]")) -> list[dict]:
        """Messages containing every word of `query`, best match first, each with a snippet whose matched
        words are between `marks` (("", ""): plain text). Words are quoted, so user input cannot reach
        FTS5's query syntax (quotes, AND/OR/NOT, *, column filters)."""
        words = re.findall(r"\w+", query)
        if not words:
            return []
        match = " ".join('"' + w + '"' for w in words)
        rows = self.db.query(
            """SELECT m.conversation_id, m.id AS message_id,
                      snippet(messages_fts, -1, ?, ?, '…', 12) AS snippet
               FROM messages_fts JOIN messages m ON m.rowid = messages_fts.rowid
               WHERE messages_fts MATCH ? ORDER BY rank LIMIT ?""",
            [*marks, match, limit])
        return list(rows)

    # -- export / import --

    def export_markdown(self, conversation_id: str) -> str:
        """The active branch as Markdown, settings in the header."""
        conv = self.get_conversation(conversation_id)
        lines = [f"# {conv['title'] or 'Untitled conversation'}", "", f"Model: {model_display_name(conv['model'])}",
                 ""]
        if conv["system_prompt"]:
            lines += ["## System", "", conv["system_prompt"], ""]
        for msg in self.active_branch(conversation_id):
            lines += [_markdown_heading(msg), ""]
            if msg["reasoning"]:  # a collapsed block, as chat apps show it
                lines += ["<details><summary>Thinking</summary>", "", msg["reasoning"], "", "</details>", ""]
            lines += [msg["content"], ""]
            lines += [f"Tool call: `{call['name']}({json.dumps(call['arguments'], ensure_ascii=False)})`\n"
                      for call in msg["tool_calls"]]
        return "\n".join(lines)

    def export_json(self, conversation_id: str) -> dict:
        """The whole conversation: settings and every message (all branches) with its parent id."""
        conv = self.get_conversation(conversation_id)
        messages = [_message(r) for r in self.db.query(
            "SELECT * FROM messages WHERE conversation_id = ? ORDER BY created_at, rowid", [conversation_id])]
        return {
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "conversation": {k: conv[k] for k in ("title", "model", "system_prompt", "sampler", "tools", "pinned",
                                                  "created_at", "updated_at", "active_leaf")},
            "messages": [{k: m[k] for k in ("id", "parent_id", "role", "content", "created_at", "meta")}
                         | {k: m[k] for k in ("reasoning", "tool_calls", "tool_result") if m[k]}  # only what it has
                         for m in messages],
        }

    def import_json(self, data: dict) -> str:
        """Import an export_json dict as a new conversation (fresh ids, same tree). Returns its id. The whole
        document is checked (engine.history.validate) before anything is written."""
        try:
            conv, messages = check_export(data)
        except HistoryError as e:
            raise HistoryError(f"cannot import conversation: {e}") from None
        ordered = _parents_first(messages)
        cid, now = _new_id(), _now()
        new_ids = {m["id"]: _new_id() for m in messages}
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO conversations (id, title, model, system_prompt, sampler, tools, created_at, updated_at,"
                " pinned, active_leaf) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (cid, conv["title"], conv["model"], conv["system_prompt"], json.dumps(conv["sampler"]),
                 _tools_json(conv["tools"]), conv["created_at"] or now, now, int(conv["pinned"]),
                 new_ids.get(conv["active_leaf"])),
            )
            for m in ordered:
                _insert_message(conn, m | {"id": new_ids[m["id"]], "conversation_id": cid,
                                           "parent_id": new_ids.get(m["parent_id"]),
                                           "created_at": m["created_at"] or now, "reasoning": m["reasoning"] or ""})
        return cid


def _title_from(content: str) -> str:
    # from the first words only: splitting a whole 200 MB message made a list of 100 million of them
    start = _NON_SPACE.search(content).start()
    head = content[start: start + 4 * TITLE_CHARS]
    line = " ".join(head.split())
    if len(line) <= TITLE_CHARS and _NON_SPACE.search(content, start + len(head)) is None:
        return line
    return line[: TITLE_CHARS - 1].rstrip() + "…"


def _markdown_heading(msg: dict) -> str:
    result = msg["tool_result"]
    if result is None:
        return f"## {msg['role'].capitalize()}"
    return f"## Tool result: {result['name']}" + (" (failed)" if result["is_error"] else "")


def _sampler_json(sampler: dict | None) -> str:
    return json.dumps(check_sampler(sampler))


def _tools_json(tools: dict | None) -> str | None:
    checked = check_tools(tools)
    return None if checked is None else json.dumps(checked, ensure_ascii=False)


def _conversation(row: dict) -> dict:
    tools = row["tools"] and json.loads(row["tools"])
    return {**row, "sampler": json.loads(row["sampler"]), "tools": tools, "pinned": bool(row["pinned"])}


def _insert_message(conn, m: dict) -> None:
    """One checked message (tool parts as check_tool_parts gives them) into its columns."""
    result = m["tool_result"] or {}
    conn.execute(
        "INSERT INTO messages (id, conversation_id, parent_id, role, content, created_at, meta, reasoning,"
        " tool_calls, tool_call_id, tool_name, is_error, seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (m["id"], m["conversation_id"], m["parent_id"], m["role"], m["content"], m["created_at"],
         json.dumps(m["meta"]), m["reasoning"], json.dumps(m["tool_calls"], ensure_ascii=False),
         result.get("call_id"), result.get("name"), int(result.get("is_error", False)), result.get("seconds")),
    )


def _message(row: dict) -> dict:
    """A stored row as a message dict: a tool message's columns gathered into `tool_result` (None elsewhere)."""
    message = {k: v for k, v in row.items() if k not in ("tool_call_id", "tool_name", "is_error", "seconds")}
    result = {"call_id": row["tool_call_id"], "name": row["tool_name"], "is_error": bool(row["is_error"]),
              "seconds": row["seconds"]}
    return message | {"meta": json.loads(row["meta"]), "tool_calls": json.loads(row["tool_calls"]),
                      "tool_result": result if row["role"] == "tool" else None}


def _parents_first(messages: list[dict]) -> list[dict]:
    """Messages ordered so each parent precedes its children, keeping the export's order among
    siblings; a parent cycle is an error."""
    children: dict = {}
    for m in messages:
        children.setdefault(m.get("parent_id"), []).append(m)
    ordered, stack = [], list(reversed(children.get(None, [])))
    while stack:
        m = stack.pop()
        ordered.append(m)
        stack.extend(reversed(children.get(m["id"], [])))
    if len(ordered) != len(messages):
        raise HistoryError("cannot import conversation: the messages' parent ids form a cycle")
    return ordered
