"""The user's say before a tool runs: a Toolbox that asks first (allow once, allow always, deny) unless the
tool is always allowed, so the tool loop that runs calls never needs to know that anybody was asked."""

from __future__ import annotations

import time
from enum import Enum
from typing import Callable

from engine.tools import ToolCall, ToolResult, ToolSpec
from engine.tools.toolbox import CombinedToolbox


class Decision(Enum):
    ALLOW = "allow"    # this call
    ALWAYS = "always"  # this call and every later call of the tool
    DENY = "deny"
    STOP = "stop"      # the turn was stopped before the user answered


class AskingToolbox:
    """`toolbox`'s tools, each call run only once `ask` (which blocks until the user answers) allows it.
    A denied call is an error result the model reads, and so is one the turn was stopped before (`ask`
    answered STOP). `on_always(name)`: the user allowed a tool always (the app keeps it); `on_result(call,
    result)`: a call ran or was denied (the app shows it). `enabled`: the switched-on tools this chat keeps
    on (None: all of them); a call of another is refused without asking."""

    def __init__(self, toolbox: CombinedToolbox, ask: Callable[[ToolCall], Decision], *,
                 on_always: Callable[[str], None] | None = None,
                 on_result: Callable[[ToolCall, ToolResult], None] | None = None,
                 enabled: frozenset[str] | None = None):
        self.toolbox, self.ask = toolbox, ask
        self.on_always, self.on_result = on_always, on_result
        self.enabled = enabled

    def specs(self) -> list[ToolSpec]:
        return [spec for spec in self.toolbox.specs() if self._on(spec.name)]

    def _on(self, name: str) -> bool:
        return self.enabled is None or name in self.enabled

    def run(self, call: ToolCall) -> ToolResult:
        start = time.monotonic()
        if not self._on(call.name):
            decision = Decision.DENY
        elif self.toolbox.switches.needs_approval(call.name):
            decision = self.ask(call)
        else:
            decision = Decision.ALLOW
        if decision is Decision.ALWAYS:
            self.toolbox.switches = self.toolbox.switches.allowed_always(call.name)
            if self.on_always is not None:
                self.on_always(call.name)
        if not self._on(call.name):
            result = ToolResult(call.id, f"the tool {call.name} is switched off in this chat", True,
                                time.monotonic() - start)
        elif decision is Decision.DENY:
            result = ToolResult(call.id, f"the user did not allow this call of {call.name}", True,
                                time.monotonic() - start)
        elif decision is Decision.STOP:
            result = ToolResult.stopped(call.id)
        else:
            result = self.toolbox.run(call)
        if self.on_result is not None:
            self.on_result(call, result)
        return result
