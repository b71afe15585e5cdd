"""One Toolbox over several (the MCP servers', the built-in tools), and the user's choices about each tool:
which are switched on, and which run without asking.

Tools are switched on one by one: a tool not in `enabled` is neither offered to the model nor run, so a
server added to the settings, or a built-in tool, does nothing until the user turns its tools on.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from engine.tools import ToolCall, ToolResult, ToolSpec, Toolbox


@dataclass(frozen=True)
class ToolSwitches:
    """What the app keeps about tools, by their names in a chat (engine.tools.mcp_client.qualified_name)."""
    enabled: frozenset[str] = frozenset()         # offered to the model
    always_allowed: frozenset[str] = frozenset()  # run without asking the user first

    def needs_approval(self, name: str) -> bool:
        return name not in self.always_allowed

    def switched(self, name: str, on: bool) -> ToolSwitches:
        return ToolSwitches(self.enabled | {name} if on else self.enabled - {name}, self.always_allowed)

    def allowed_always(self, name: str, allowed: bool = True) -> ToolSwitches:
        always = self.always_allowed | {name} if allowed else self.always_allowed - {name}
        return ToolSwitches(self.enabled, always)

    def to_json(self) -> str:
        return json.dumps({"enabled": sorted(self.enabled), "always_allowed": sorted(self.always_allowed)})

    @classmethod
    def from_json(cls, text: str | None) -> ToolSwitches:
        """What to_json wrote; anything else (nothing saved yet, a hand-edited file) is every tool off."""
        try:
            data = json.loads(text or "{}")
            return cls(frozenset(map(str, data.get("enabled", []))),
                       frozenset(map(str, data.get("always_allowed", []))))
        except (ValueError, TypeError, AttributeError):
            return cls()


@dataclass
class CombinedToolbox:
    """The switched-on tools of several toolboxes, as one. A name listed by two is the first one's."""
    parts: list[Toolbox]
    switches: ToolSwitches = field(default_factory=ToolSwitches)
    _routes: dict[str, Toolbox] = field(default_factory=dict, init=False, repr=False)  # as last listed

    def all_specs(self) -> list[ToolSpec]:
        """Every tool, switched on or not (for the settings' list)."""
        self._routes, specs = {}, []
        for part in self.parts:
            for spec in part.specs():
                if spec.name not in self._routes:
                    self._routes[spec.name] = part
                    specs.append(spec)
        return specs

    def specs(self) -> list[ToolSpec]:
        return [spec for spec in self.all_specs() if spec.name in self.switches.enabled]

    def run(self, call: ToolCall) -> ToolResult:
        start = time.monotonic()
        if call.name not in self.switches.enabled:
            return ToolResult(call.id, f"the tool {call.name} is switched off", True, time.monotonic() - start)
        if call.name not in self._routes:  # not listed yet, or a document attached since
            self.all_specs()
        part = self._routes.get(call.name)
        if part is None:
            return ToolResult(call.id, f"no tool is called {call.name}", True, time.monotonic() - start)
        try:
            return part.run(call)
        except Exception as e:  # a toolbox breaking its promise must still not take the conversation down
            return ToolResult(call.id, f"{call.name} failed: {type(e).__name__}: {e}", True, time.monotonic() - start)

    def replace_part(self, old: Toolbox, new: Toolbox) -> None:
        """`new` in `old`'s place (the servers changed); tools are routed afresh."""
        self.parts[self.parts.index(old)] = new
        self._routes = {}

    def close(self) -> None:
        for part in self.parts:
            close = getattr(part, "close", None)
            if close is not None:
                close()
