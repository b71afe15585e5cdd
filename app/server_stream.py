"""What the Responses and Messages endpoints share in telling a reply: server-sent event frames, the reply's
parts (its reasoning, then its answer text) as a stream opens and closes them, and the same parts of a
reply answered whole, so both ways end on one shape."""

from __future__ import annotations

import json

from engine.chat.reasoning import Thought
from engine.serving.service import JobResult
from engine.tools import ToolCall

REASONING, TEXT = "reasoning", "text"


def sse(payload: dict, event: str | None = None) -> bytes:
    """One server-sent event; named (`event:`) as the Responses and Messages clients read them."""
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + f"data: {data}\n\n".encode()


def arguments_json(call: ToolCall) -> str:
    """A call's arguments as the JSON text the APIs send."""
    return json.dumps(call.arguments, ensure_ascii=False)


def whole_parts(text: str, result: JobResult) -> list[tuple[str, str]]:
    """A whole reply's parts, as a stream of it would have closed them: (kind, text)."""
    parts = [(REASONING, result.reasoning)] if result.reasoning else []
    return parts + ([(TEXT, text)] if text or not result.tool_calls else [])


class PartStream:
    """A streamed reply's parts in order: each opened at its first piece and closed when a piece of the
    other kind comes or the reply ends; `parts` are the closed ones. Subclasses write the frames."""

    def __init__(self):
        self.parts: list[tuple[str, str]] = []
        self.kind: str | None = None
        self.text = ""

    def push(self, piece: str) -> bytes:
        kind = REASONING if isinstance(piece, Thought) else TEXT
        frames = b""
        if kind != self.kind:
            frames += self.close()
            self.kind, self.text = kind, ""
            frames += self.opened(kind, len(self.parts))
        self.text += piece
        return frames + self.delta(kind, len(self.parts), str(piece))

    def close(self) -> bytes:
        if self.kind is None:
            return b""
        frames = self.closed(self.kind, len(self.parts), self.text)
        self.parts.append((self.kind, self.text))
        self.kind = None
        return frames

    def opened(self, kind: str, index: int) -> bytes:
        raise NotImplementedError

    def delta(self, kind: str, index: int, text: str) -> bytes:
        raise NotImplementedError

    def closed(self, kind: str, index: int, text: str) -> bytes:
        raise NotImplementedError
