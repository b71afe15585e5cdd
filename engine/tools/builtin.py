"""Built-in tools for an assistant that works offline: search the user's own conversations, read from a
document attached to the chat, read the one file the user picked. Nothing leaves the machine; each tool is
switched on by the user (engine.tools.toolbox.ToolSwitches: all are off by default).

A tool's failure (nothing found is not one) raises ToolFailed with words for the model and the user;
BuiltinToolbox turns it into an error result.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Iterable, Protocol

from engine.cartridge.ingest import read_document
from engine.errors import DocumentError, FucinaError
from engine.history.store import HistoryStore
from engine.tools import ToolCall, ToolResult, ToolSpec

SEARCH_CONVERSATIONS = "search_conversations"
READ_DOCUMENT = "read_document"
READ_FILE = "read_file"
BUILTIN_NAMES = (SEARCH_CONVERSATIONS, READ_DOCUMENT, READ_FILE)

EXCERPT_CHARS = 4000        # what one read gives by default: a few pages, well within a small model's context
MAX_EXCERPT_CHARS = 16000
MAX_SEARCH_RESULTS = 20
MAX_PICKED_FILE_BYTES = 4 << 20
_OPEN_CHAT_HITS = 50  # matches in the open chat, left out, that a search may meet before the others


class ToolFailed(FucinaError):
    """A built-in tool could not do what it was asked; the message says why."""


class BuiltinTool(Protocol):
    def spec(self) -> ToolSpec | None:
        """The tool as the model sees it; None while it has nothing to work on (no document attached)."""

    def __call__(self, arguments: dict) -> str: ...


class BuiltinToolbox:
    """Built-in tools as a Toolbox (engine.tools)."""

    def __init__(self, tools: Iterable[BuiltinTool]):
        self._tools = list(tools)

    def specs(self) -> list[ToolSpec]:
        return [spec for spec in (tool.spec() for tool in self._tools) if spec is not None]

    def run(self, call: ToolCall) -> ToolResult:
        start = time.monotonic()
        tool = next((t for t in self._tools if (spec := t.spec()) is not None and spec.name == call.name), None)
        try:
            if tool is None:
                raise ToolFailed(f"no built-in tool {call.name} is available")
            content, error = tool(call.arguments), False
        except (FucinaError, OSError) as e:  # ToolFailed, a store or a document that cannot be read
            content, error = str(e), True
        return ToolResult(call.id, content, is_error=error, seconds=time.monotonic() - start)


class ConversationSearch:
    """Full-text search over the user's stored conversations (the history store's index), but the open one
    (`open_conversation()`: its id, or None), which the model reads already and whose last message, asking
    for the search, would be the first match."""

    def __init__(self, db_path: str | os.PathLike, open_conversation: Callable[[], str | None] = lambda: None):
        self.db_path, self._open_conversation = db_path, open_conversation

    def spec(self) -> ToolSpec:
        return ToolSpec(SEARCH_CONVERSATIONS,
                        "Search the user's past conversations with you for messages containing all the given words",
                        {"type": "object", "properties": {
                            "query": {"type": "string", "description": "the words to find"},
                            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_SEARCH_RESULTS,
                                      "description": "how many messages at most (default 5)"}},
                         "required": ["query"]})

    def __call__(self, arguments: dict) -> str:
        query = _argument(arguments, "query", str)
        limit = min(max(_argument(arguments, "limit", int, 5), 1), MAX_SEARCH_RESULTS)
        # a connection of its own: SQLite connections belong to the thread that made them
        with HistoryStore(self.db_path) as store:
            hits = store.search(query, limit=limit + _OPEN_CHAT_HITS, marks=("**", "**"))
            hits = [hit for hit in hits if hit["conversation_id"] != self._open_conversation()][:limit]
            lines = []
            for hit in hits:
                conversation = store.get_conversation(hit["conversation_id"])
                message = store.get_message(hit["message_id"])
                lines.append(f'- "{conversation["title"] or "Untitled"}" ({message["created_at"][:10]}, '
                             f'{message["role"]}): {hit["snippet"]}')
        return "\n".join(lines) if lines else f"no message of the user's other conversations contains: {query}"


class DocumentReader:
    """Reads the text of the documents attached to the chat, a range of characters at a time.
    `documents` gives the attached documents now, as (name, path) pairs."""

    def __init__(self, documents: Callable[[], list[tuple[str, str | os.PathLike]]]):
        self._documents = documents
        self._read: tuple[Path, float, str] | None = None  # the last document read: path, mtime, text

    def spec(self) -> ToolSpec | None:
        names = [name for name, _ in self._documents()]
        if not names:
            return None
        return ToolSpec(READ_DOCUMENT, "Read part of a document the user attached to this chat",
                        {"type": "object", "properties": {"name": {"type": "string", "enum": names}, **_RANGE},
                         "required": ["name"]})

    def __call__(self, arguments: dict) -> str:
        name = _argument(arguments, "name", str)
        paths = dict(self._documents())
        if name not in paths:
            raise ToolFailed(f"no document {name!r} is attached to this chat"
                             + (f" (attached: {', '.join(paths)})" if paths else ""))
        try:
            text = self._text(Path(paths[name]))
        except OSError as e:  # moved or deleted since it was attached
            raise ToolFailed(f"the document {name} cannot be read any more: {e.strerror or e}") from None
        return _excerpt(name, text, arguments)

    def _text(self, path: Path) -> str:
        """The document's text, read again only when the file changed (a PDF is slow to read)."""
        mtime = path.stat().st_mtime
        if self._read is None or self._read[:2] != (path, mtime):
            self._read = (path, mtime, read_document(path).text)
        return self._read[2]


class PickedFile:
    """Reads the one file the user picked for the chat, and no other; files over `max_bytes` are refused."""

    def __init__(self, max_bytes: int = MAX_PICKED_FILE_BYTES):
        self.max_bytes = max_bytes
        self.path: Path | None = None

    def pick(self, path: str | os.PathLike | None) -> None:
        self.path = None if path is None else Path(path).resolve()

    def spec(self) -> ToolSpec | None:
        if self.path is None:
            return None
        return ToolSpec(READ_FILE, f"Read part of the file the user picked for you to read, {self.path.name}",
                        {"type": "object", "properties": {"path": {"type": "string", "enum": [self.path.name]},
                                                          **_RANGE}})

    def __call__(self, arguments: dict) -> str:
        if self.path is None:
            raise ToolFailed("the user has not picked a file to read")
        asked = _argument(arguments, "path", str, self.path.name)
        if asked != self.path.name and Path(asked).expanduser().resolve() != self.path:
            raise ToolFailed(f"only {self.path.name}, the file the user picked, can be read; not {asked}")
        size = self.path.stat().st_size
        if size > self.max_bytes:
            raise ToolFailed(f"{self.path.name} is {size / 1e6:.1f} MB; files of up to "
                             f"{self.max_bytes / 1e6:.1f} MB are read")
        try:
            text = read_document(self.path).text
        except DocumentError as e:
            raise ToolFailed(str(e)) from None
        return _excerpt(self.path.name, text, arguments)


_RANGE = {"start": {"type": "integer", "minimum": 0, "description": "the first character to read (default 0)"},
          "length": {"type": "integer", "minimum": 1, "maximum": MAX_EXCERPT_CHARS,
                     "description": f"how many characters (default {EXCERPT_CHARS})"}}


def _excerpt(name: str, text: str, arguments: dict) -> str:
    """Characters [start, start + length) of the text, headed by where they are, so the model can read on."""
    start = max(_argument(arguments, "start", int, 0), 0)
    length = min(max(_argument(arguments, "length", int, EXCERPT_CHARS), 1), MAX_EXCERPT_CHARS)
    if start >= len(text):
        raise ToolFailed(f"{name} has {len(text)} characters; start must be below that")
    end = min(start + length, len(text))
    more = f"; read on with start={end}" if end < len(text) else " (the end)"
    return f"[{name}: characters {start}-{end} of {len(text)}{more}]\n{text[start:end]}"


def _argument(arguments: dict, key: str, kind: type, default=None):
    value = arguments.get(key, default)
    if value is None:
        raise ToolFailed(f"the argument {key!r} is missing")
    if kind is int and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)  # small models write numbers as strings
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ToolFailed(f"the argument {key!r} must be a {'whole number' if kind is int else 'string'}")
    return value
