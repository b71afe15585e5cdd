"""A tool call in the chat, as a block: the tool, its arguments, then either the Allow / Allow always / Deny
buttons the engine waits on, or the result and how long the call took; a turn's blocks in a column, and the
latest turn's column in a panel above the composer."""

from __future__ import annotations

import json
import threading

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QLayout, QPushButton, QScrollArea, QVBoxLayout,
                               QWidget)

from app.gui.markdown_view import SELECTABLE
from engine.tools import ToolCall, ToolResult
from engine.tools.approval import Decision

RESULT_CHARS = 2000  # shown; the model reads the whole result


class ToolCallBlock(QFrame):
    decided = Signal(object)  # Decision

    def __init__(self, call: ToolCall, *, asking: bool):
        """`asking`: the engine waits for the user's answer (else the tool is always allowed)."""
        super().__init__()
        self.setObjectName("toolCallBlock")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.call = call
        self.title = QLabel(f"Tool: {call.name}")
        self.title.setObjectName("toolCallTitle")
        self.arguments = _text_label(json.dumps(call.arguments, indent=2, ensure_ascii=False), "muted")
        self.status = _text_label("Waiting for your answer" if asking else "Running…", "muted")
        self.result = _text_label("", None)
        self.result.hide()
        self.buttons = {decision: QPushButton(label) for decision, label in (
            (Decision.ALLOW, "Allow"), (Decision.ALWAYS, "Allow always"), (Decision.DENY, "Deny"))}
        row = QHBoxLayout()
        for decision, button in self.buttons.items():
            button.setAccessibleName(f"{button.text()}: {call.name}")
            button.clicked.connect(lambda _=False, d=decision: self._decide(d))
            button.setVisible(asking)
            row.addWidget(button)
        row.addStretch(1)
        column = QVBoxLayout(self)
        column.addWidget(self.title)
        column.addWidget(self.arguments)
        column.addWidget(self.status)
        column.addLayout(row)
        column.addWidget(self.result)

    def _decide(self, decision: Decision) -> None:
        for button in self.buttons.values():
            button.hide()
        self.status.setText("Denied" if decision is Decision.DENY else "Running…")
        self.decided.emit(decision)

    def show_result(self, result: ToolResult) -> None:
        for button in self.buttons.values():  # a turn stopped while it asked
            button.hide()
        outcome = "Failed" if result.is_error else "Done"
        if result.is_error and self.status.text() == "Denied":
            outcome = "Denied"
        stopped = result == ToolResult.stopped(result.call_id)  # it never ran: no time to tell
        self.status.setText("Stopped" if stopped else f"{outcome} in {result.seconds:.2f} s")
        text = result.content
        self.result.setText(text if len(text) <= RESULT_CHARS else text[:RESULT_CHARS] + "…")
        self.result.show()


def _text_label(text: str, tone: str | None) -> QLabel:
    label = QLabel(text)
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setWordWrap(True)
    label.setTextInteractionFlags(SELECTABLE)
    if tone:
        label.setProperty("tone", tone)
    return label


class ToolCallColumn(QWidget):
    """One turn's tool calls, a block each in the order they came. Connect ToolApprovals' `requested` to
    ask() and `finished` to show_result() (slots of this UI-thread object, so they are queued here); calls of
    other turns are not this column's."""

    def __init__(self, turn: threading.Event):
        super().__init__()
        self.turn = turn
        self.blocks: dict[str, ToolCallBlock] = {}  # by call id
        self._column = QVBoxLayout(self)
        self._column.setContentsMargins(0, 0, 0, 0)
        # never squeezed below its blocks' text in the panel's scroll area: the panel scrolls instead
        self._column.setSizeConstraint(QLayout.SizeConstraint.SetMinimumSize)

    @Slot(object)
    def ask(self, pending) -> None:
        """A call waiting for the user (app.gui.tool_approval.PendingApproval)."""
        if pending.turn is self.turn:
            block = self._add(pending.call, asking=True)
            block.decided.connect(pending.answer)

    @Slot(object, object, object)
    def show_result(self, call: ToolCall, result: ToolResult, turn: threading.Event) -> None:
        if turn is self.turn:
            block = self.blocks.get(call.id) or self._add(call, asking=False)  # always allowed: never asked
            block.show_result(result)

    def _add(self, call: ToolCall, *, asking: bool) -> ToolCallBlock:
        block = self.blocks[call.id] = ToolCallBlock(call, asking=asking)
        self._column.addWidget(block)
        return block


class ToolCallsPanel(QScrollArea):
    """The tool calls of the reply in progress, between the chat and the composer; hidden while there are
    none and once the turn ended (the chat shows them). A call of a newer turn starts the list afresh; one
    of a stopped turn is not shown (its question was answered by the stop)."""
    MAX_HEIGHT_PX = 260

    def __init__(self):
        super().__init__()
        self.setWidgetResizable(True)
        self.setMaximumHeight(self.MAX_HEIGHT_PX)
        self.setAccessibleName("Tool calls")
        self.column: ToolCallColumn | None = None
        self.hide()

    @Slot(object)
    def ask(self, pending) -> None:
        if not pending.turn.is_set():
            self._column_for(pending.turn).ask(pending)
            self._show_latest()

    @Slot(object, object, object)
    def show_result(self, call: ToolCall, result: ToolResult, turn: threading.Event) -> None:
        self._column_for(turn).show_result(call, result, turn)
        self._show_latest()

    def turn_ended(self) -> None:
        """The chat shows the turn's calls and results now, each after the reply that made it: the panel,
        which holds the calls while they ask and run, makes way for the chat."""
        self.hide()

    def clear(self) -> None:
        """Another conversation: its calls are not these."""
        self.column = None
        self.takeWidget()
        self.hide()

    def _column_for(self, turn: threading.Event) -> ToolCallColumn:
        if self.column is None or self.column.turn is not turn:
            self.column = ToolCallColumn(turn)
            self.setWidget(self.column)  # the last turn's column goes with it
        return self.column

    def _show_latest(self) -> None:
        self.show()
        self.ensureWidgetVisible(list(self.column.blocks.values())[-1])
