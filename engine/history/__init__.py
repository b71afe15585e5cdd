"""Chat history: conversations as message trees in a local SQLite file."""

from engine.history.store import HistoryError, HistoryStore

__all__ = ["HistoryError", "HistoryStore"]
