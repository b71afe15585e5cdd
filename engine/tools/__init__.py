"""Tools a reply may call: what a tool is, a call the model made, and what running it gave.

The model side (rendering tools through the chat template, parsing and constraining calls) and the tool
side (MCP servers, the built-in tools) meet here: a Toolbox lists ToolSpecs and runs ToolCalls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

STOPPED = "The turn was stopped before this tool call ran."


@dataclass(frozen=True)
class ToolSpec:
    """A tool as OpenAI's `function` object names it: what chat templates' `tools` variable takes."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def as_openai(self) -> dict[str, Any]:
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    content: str           # what goes back to the model as the tool message
    is_error: bool = False  # the tool failed: content says how, in words the model and the user can read
    seconds: float = 0.0

    @classmethod
    def stopped(cls, call_id: str) -> ToolResult:
        """A call the turn was stopped before: it did not run, and the chat keeps it saying so."""
        return cls(call_id, STOPPED, is_error=True)


class Toolbox(Protocol):
    """A set of tools a turn may call. run() never raises for a tool's own failure: it returns an error
    result, so the conversation and everything already said is kept."""

    def specs(self) -> list[ToolSpec]: ...

    def run(self, call: ToolCall) -> ToolResult: ...
