"""Chat history: conversations as message trees in a local SQLite file."""

from engine.errors import HistoryError
from engine.history.store import HistoryStore

__all__ = ["HistoryError", "HistoryStore"]
