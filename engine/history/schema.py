"""The history database's schema, as an ordered list of migrations."""

import sqlite_utils


def _schema_v1(db: sqlite_utils.Database) -> None:
    # Raw DDL: sqlite-utils' create() cannot declare ON DELETE CASCADE. IF NOT EXISTS keeps a
    # migration interrupted by a crash re-runnable.
    db.executescript(
        """
        CREATE TABLE IF NOT EXISTS conversations (
            id TEXT PRIMARY KEY,
            title TEXT,
            model TEXT NOT NULL,
            system_prompt TEXT,
            sampler TEXT NOT NULL DEFAULT '{}',
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            pinned INTEGER NOT NULL DEFAULT 0,
            active_leaf TEXT
        );
        CREATE TABLE IF NOT EXISTS messages (
            id TEXT PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            parent_id TEXT REFERENCES messages(id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
            content TEXT NOT NULL,
            created_at TEXT NOT NULL,
            meta TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX IF NOT EXISTS messages_conversation ON messages(conversation_id);
        CREATE INDEX IF NOT EXISTS messages_parent ON messages(parent_id);
        CREATE TABLE IF NOT EXISTS attachments (
            id TEXT PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            name TEXT NOT NULL,
            kind TEXT NOT NULL,
            path TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS attachments_conversation ON attachments(conversation_id);
        """
    )
    if "messages_fts" not in db.table_names():
        db["messages"].enable_fts(["content"], create_triggers=True)


def _schema_v2(db: sqlite_utils.Database) -> None:
    # An attachment names its document by the SHA-256 of its text (what its cartridge is stored under, so a
    # reopened chat loads the same rows without reading the file) and its tokens. Rows from before have
    # NULLs: their file is read again. Columns checked first: a crash between ALTER and the version row
    # re-runs this.
    columns = {c.name for c in db["attachments"].columns}
    for column, kind in (("document", "TEXT"), ("tokens", "INTEGER")):
        if column not in columns:
            db.execute(f"ALTER TABLE attachments ADD COLUMN {column} {kind}")


def _schema_v3(db: sqlite_utils.Database) -> None:
    # A reply's reasoning (a reasoning model's, before its answer) is kept apart from its content, so the
    # answer alone is shown, exported and rendered as the reply; older rows have none. The full-text index
    # is rebuilt over both columns (sqlite-utils' replace drops the old index and its triggers, then
    # indexes every row again), so a search finds words of the reasoning too.
    if "reasoning" not in {c.name for c in db["messages"].columns}:
        db.execute("ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT ''")
    db["messages"].enable_fts(["content", "reasoning"], create_triggers=True, replace=True)


_MESSAGE_COLUMNS = "id, conversation_id, parent_id, role, content, created_at, meta, reasoning"


def _schema_v4(db: sqlite_utils.Database) -> None:
    # Tool calls are part of a conversation: a reply keeps the calls it made (tool_calls, a JSON list of
    # {id, name, arguments}) and each result is a message of role 'tool' under it (its content the result's
    # text, with the call it answers, the tool, whether it failed and how long it ran), so a reopened chat
    # renders them for the model again. The role CHECK cannot be altered in SQLite, so the table is rebuilt
    # its documented way (foreign keys off, one transaction): a crash inside leaves the old table and the
    # next open re-runs this. The index then covers the calls' arguments too.
    if "tool_calls" not in {c.name for c in db["messages"].columns}:
        db.execute("PRAGMA foreign_keys = OFF")  # a no-op inside a transaction, so before it
        try:
            db.executescript(
                f"""
                BEGIN;
                CREATE TABLE messages_v4 (
                    id TEXT PRIMARY KEY,
                    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
                    parent_id TEXT REFERENCES messages(id) ON DELETE CASCADE,
                    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
                    content TEXT NOT NULL,
                    created_at TEXT NOT NULL,
                    meta TEXT NOT NULL DEFAULT '{{}}',
                    reasoning TEXT NOT NULL DEFAULT '',
                    tool_calls TEXT NOT NULL DEFAULT '[]',
                    tool_call_id TEXT,
                    tool_name TEXT,
                    is_error INTEGER NOT NULL DEFAULT 0,
                    seconds REAL
                );
                INSERT INTO messages_v4 ({_MESSAGE_COLUMNS}) SELECT {_MESSAGE_COLUMNS} FROM messages;
                DROP TABLE messages;
                ALTER TABLE messages_v4 RENAME TO messages;
                CREATE INDEX messages_conversation ON messages(conversation_id);
                CREATE INDEX messages_parent ON messages(parent_id);
                COMMIT;
                """
            )
        except BaseException:
            if db.conn.in_transaction:  # a failing statement leaves the script's transaction open
                db.conn.rollback()
            raise
        finally:
            db.execute("PRAGMA foreign_keys = ON")
    db["messages"].enable_fts(["content", "reasoning", "tool_calls"], create_triggers=True, replace=True)


def _schema_v5(db: sqlite_utils.Database) -> None:
    # A conversation may keep its own tool setting (JSON {"enabled": [names], "choice": ...}: the tools on in
    # it and how they are offered); NULL, as every older row has, follows the app's defaults. Column checked
    # first: a crash between ALTER and the version row re-runs this.
    if "tools" not in {c.name for c in db["conversations"].columns}:
        db.execute("ALTER TABLE conversations ADD COLUMN tools TEXT")


# Applied in order on open; the list index + 1 is the schema version. Append, never edit.
MIGRATIONS = [_schema_v1, _schema_v2, _schema_v3, _schema_v4, _schema_v5]
