"""The tools a chat's replies may call, and OpenAI's tool_choice over them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from engine.errors import InvalidGrammar
from engine.sampling.grammar import Grammar
from engine.tools import ToolSpec

CHOICES = ("auto", "required", "none")  # or a tool's name: that tool is called, at once
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # OpenAI's rule for function names


@dataclass(frozen=True)
class ToolUse:
    tools: tuple[ToolSpec, ...]
    choice: str = "auto"

    def __post_init__(self):
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {', '.join(names)}")
        if self.choice not in CHOICES and self.choice not in names:
            raise ValueError(f"tool_choice must be one of {', '.join(CHOICES)} or a tool's name, got {self.choice!r}")
        if self.choice == "required" and not self.tools:
            raise ValueError("tool_choice 'required' needs at least one tool")

    @classmethod
    def available(cls, tools: Sequence[ToolSpec], choice: str) -> ToolUse:
        """`choice` over the tools a chat has now, where they can honour it: a chat's tools come and go (a file
        not picked yet, a server down), so a choice naming one not there, or requiring a call with none there,
        is Auto's."""
        tools = tuple(tools)
        missing = choice not in CHOICES and choice not in {t.name for t in tools}
        return cls(tools, "auto" if missing or (choice == "required" and not tools) else choice)

    @property
    def active(self) -> bool:
        """Whether the replies are offered the tools (`none`: neither rendered nor constrained)."""
        return bool(self.tools) and self.choice != "none"

    @property
    def must_call(self) -> bool:
        """The reply starts with a call."""
        return self.active and self.choice != "auto"

    @property
    def callable(self) -> tuple[ToolSpec, ...]:
        """The tools a call may name: the chosen one, or all of them."""
        return tuple(t for t in self.tools if t.name == self.choice) or self.tools


def specs_from_openai(tools: Any) -> tuple[ToolSpec, ...]:
    """OpenAI's `tools` array ({type: function, function: {name, description, parameters}}; a bare function
    object is taken too) as ToolSpecs; ValueError naming the entry that is not one. Every tool's parameters
    must be a JSON schema its calls can be held to."""
    if not isinstance(tools, list):
        raise ValueError("tools must be an array of {type: function, function: {name, description, parameters}}")
    specs = []
    for i, tool in enumerate(tools):
        is_function = isinstance(tool, dict) and tool.get("type", "function") == "function"
        function = tool.get("function", tool) if is_function else None
        if not isinstance(function, dict):
            raise ValueError(f"tools[{i}] must be an object of type function with a function object")
        name, description = function.get("name"), function.get("description", "")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"tools[{i}].function.name must be 1 to 64 letters, digits, '_', '-' or '.', got {name!r}")
        if not isinstance(description, str):
            raise ValueError(f"tools[{i}].function.description must be a string")
        if not isinstance(parameters, dict):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object")
        try:
            Grammar("json_schema", json.dumps(parameters))
        except InvalidGrammar as e:
            raise ValueError(f"tools[{i}].function.parameters: {e}") from None
        specs.append(ToolSpec(name, description, parameters))
    return tuple(specs)
