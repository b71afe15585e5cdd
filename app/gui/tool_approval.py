"""Asking the user before a tool runs, from the engine thread: the worker's tool loop calls `ask(call)`,
which hands the UI a PendingApproval through a queued signal and waits for its answer on the engine thread,
never on the UI thread. A turn stopped meanwhile (its cancel event set) is a denial, so Stop never leaves the
engine waiting for a click that will not come."""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Signal

from engine.tools import ToolCall, ToolResult
from engine.tools.approval import Decision

_CANCEL_POLL_S = 0.1


class PendingApproval:
    """One call waiting for the user's answer: answered on the UI thread, waited on by the engine's."""

    def __init__(self, call: ToolCall):
        self.call = call
        self.decision: Decision | None = None
        self._answered = threading.Event()

    def answer(self, decision: Decision) -> None:
        if self.decision is None:  # the first answer counts (a double click, a stop)
            self.decision = decision
            self._answered.set()

    def wait(self, cancel: threading.Event) -> Decision:
        while not self._answered.wait(_CANCEL_POLL_S):
            if cancel.is_set():
                self.answer(Decision.DENY)
        return self.decision


class ToolApprovals(QObject):
    """The engine thread's side of one turn's approvals; the UI listens to its signals."""
    requested = Signal(object)      # PendingApproval: show the call, with Allow / Allow always / Deny
    finished = Signal(object, object)  # ToolCall, ToolResult: the call ran (or was denied)

    def __init__(self, cancel: threading.Event):
        super().__init__()
        self.cancel = cancel

    def ask(self, call: ToolCall) -> Decision:
        """Blocks the calling (engine) thread until the user answers or the turn stops."""
        pending = PendingApproval(call)
        self.requested.emit(pending)
        return pending.wait(self.cancel)

    def tell_result(self, call: ToolCall, result: ToolResult) -> None:
        self.finished.emit(call, result)
