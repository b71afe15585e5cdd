"""Asking the user before a tool runs, from the engine thread: the worker's tool loop calls `ask(call, turn)`,
which hands the UI a PendingApproval through a queued signal and waits for its answer on the engine thread,
never on the UI thread. A turn stopped meanwhile (its cancel event set) answers it (Decision.STOP: the call
does not run, and its result says why), so Stop never leaves the engine waiting for a click that will not
come."""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Signal

from engine.tools import ToolCall, ToolResult
from engine.tools.approval import Decision

_CANCEL_POLL_S = 0.1


class PendingApproval:
    """One call waiting for the user's answer: answered on the UI thread, waited on by the engine's."""

    def __init__(self, call: ToolCall, turn: threading.Event):
        self.call, self.turn = call, turn  # the turn: its cancel event, by which the UI knows its turns
        self.decision: Decision | None = None
        self._answered = threading.Event()

    def answer(self, decision: Decision) -> None:
        if self.decision is None:  # the first answer counts (a double click, a stop)
            self.decision = decision
            self._answered.set()

    def wait(self) -> Decision:
        while not self._answered.wait(_CANCEL_POLL_S):
            if self.turn.is_set():
                self.answer(Decision.STOP)
        return self.decision


class ToolApprovals(QObject):
    """The engine thread's side of the approvals; the UI listens to its signals (with slots of UI objects,
    so they are queued to the UI thread)."""
    requested = Signal(object)      # PendingApproval: show the call, with Allow / Allow always / Deny
    finished = Signal(object, object, object)  # ToolCall, ToolResult, the turn: the call ran (or was denied)

    def ask(self, call: ToolCall, turn: threading.Event) -> Decision:
        """Blocks the calling (engine) thread until the user answers or the turn stops."""
        pending = PendingApproval(call, turn)
        self.requested.emit(pending)
        return pending.wait()

    def tell_result(self, call: ToolCall, result: ToolResult, turn: threading.Event) -> None:
        self.finished.emit(call, result, turn)
