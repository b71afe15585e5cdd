"""Helpers for the history tests."""

import uuid


def old_conversation(db, model: str = "m") -> str:
    """A conversation row in a database of an older schema, whose columns the store's own insert outgrew."""
    cid = str(uuid.uuid4())
    db.execute("INSERT INTO conversations (id, model, created_at, updated_at) VALUES (?, ?, ?, ?)",
               [cid, model, "2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00+00:00"])
    return cid
