"""Asking the user before a tool runs: the engine thread waits on the answer, the UI thread stays free, and
the answer decides what the model reads."""

import threading

from PySide6.QtCore import Qt

from app.gui.tool_approval import PendingApproval, ToolApprovals
from app.gui.tool_call_block import ToolCallColumn
from engine.tools import ToolCall, ToolResult, ToolSpec
from engine.tools.approval import AskingToolbox, Decision
from engine.tools.toolbox import CombinedToolbox, ToolSwitches


class Recorder:
    """A toolbox with one tool that records its calls."""

    def __init__(self):
        self.calls = []

    def specs(self):
        return [ToolSpec("echo")]

    def run(self, call):
        self.calls.append(call)
        return ToolResult(call.id, f"echo: {call.arguments['text']}", seconds=0.25)


def engine_turn(qtbot, switches=ToolSwitches(frozenset({"echo"}))):
    """A toolbox that asks through ToolApprovals, and the UI's column of calls listening to it."""
    tool = Recorder()
    combined = CombinedToolbox([tool], switches)
    cancel = threading.Event()  # the turn
    approvals = ToolApprovals()
    always = []
    asking = AskingToolbox(combined, lambda call: approvals.ask(call, cancel), on_always=always.append,
                           on_result=lambda call, result: approvals.tell_result(call, result, cancel))
    column = ToolCallColumn(cancel)
    qtbot.addWidget(column)
    column.show()
    approvals.requested.connect(column.ask)
    approvals.finished.connect(column.show_result)
    return tool, asking, column, cancel, always


def run_on_engine_thread(asking, call):
    """The call, run on a thread of its own as the engine's worker runs it; its result lands in the list."""
    results = []
    thread = threading.Thread(target=lambda: results.append(asking.run(call)))
    thread.start()
    return thread, results


def test_allow_runs_the_call_and_shows_its_result(qtbot):
    tool, asking, column, _, _ = engine_turn(qtbot)
    call = ToolCall("c1", "echo", {"text": "hi"})
    thread, results = run_on_engine_thread(asking, call)
    qtbot.waitUntil(lambda: "c1" in column.blocks)  # the UI thread runs its events while the engine waits
    block = column.blocks["c1"]
    assert block.title.text() == "Tool: echo" and '"text": "hi"' in block.arguments.text()
    assert block.status.text() == "Waiting for your answer" and tool.calls == []
    qtbot.mouseClick(block.buttons[Decision.ALLOW], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not thread.is_alive())
    assert results[0] == ToolResult("c1", "echo: hi", seconds=0.25) and tool.calls == [call]
    qtbot.waitUntil(lambda: block.result.isVisible())
    assert block.result.text() == "echo: hi" and block.status.text() == "Done in 0.25 s"
    assert not block.buttons[Decision.ALLOW].isVisible()


def test_deny_gives_the_model_an_error_result_and_runs_nothing(qtbot):
    tool, asking, column, _, _ = engine_turn(qtbot)
    thread, results = run_on_engine_thread(asking, ToolCall("c2", "echo", {"text": "rm -rf"}))
    qtbot.waitUntil(lambda: "c2" in column.blocks)
    qtbot.mouseClick(column.blocks["c2"].buttons[Decision.DENY], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not thread.is_alive())
    assert results[0].is_error and results[0].content == "the user did not allow this call of echo"
    assert tool.calls == []
    qtbot.waitUntil(lambda: column.blocks["c2"].status.text().startswith("Denied in "))


def test_allow_always_runs_later_calls_without_asking(qtbot):
    tool, asking, column, _, always = engine_turn(qtbot)
    thread, _ = run_on_engine_thread(asking, ToolCall("c3", "echo", {"text": "one"}))
    qtbot.waitUntil(lambda: "c3" in column.blocks)
    qtbot.mouseClick(column.blocks["c3"].buttons[Decision.ALWAYS], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not thread.is_alive())
    assert always == ["echo"]
    thread, results = run_on_engine_thread(asking, ToolCall("c4", "echo", {"text": "two"}))
    thread.join(5)
    assert results[0].content == "echo: two" and len(tool.calls) == 2
    qtbot.waitUntil(lambda: "c4" in column.blocks and column.blocks["c4"].result.isVisible())
    assert not column.blocks["c4"].buttons[Decision.ALLOW].isVisible()  # shown as it ran, never asked


def test_stopping_the_turn_while_it_asks_stops_the_call(qtbot):
    tool, asking, column, cancel, _ = engine_turn(qtbot)
    thread, results = run_on_engine_thread(asking, ToolCall("c5", "echo", {"text": "x"}))
    qtbot.waitUntil(lambda: "c5" in column.blocks)
    cancel.set()
    qtbot.waitUntil(lambda: not thread.is_alive())
    assert results[0] == ToolResult.stopped("c5") and tool.calls == []
    qtbot.waitUntil(lambda: column.blocks["c5"].status.text() == "Stopped")


def test_the_first_answer_counts():
    pending = PendingApproval(ToolCall("c", "echo", {}), threading.Event())
    pending.answer(Decision.ALLOW)
    pending.answer(Decision.DENY)
    assert pending.wait() is Decision.ALLOW


def test_a_column_shows_only_its_own_turns_calls(qtbot):
    column = ToolCallColumn(threading.Event())
    qtbot.addWidget(column)
    other_turn = threading.Event()
    column.ask(PendingApproval(ToolCall("c", "echo", {}), other_turn))
    column.show_result(ToolCall("c", "echo", {}), ToolResult("c", "x"), other_turn)
    assert column.blocks == {}


def test_the_worker_runs_a_turns_calls_on_its_thread_and_waits_there_for_the_answer(qtbot, tmp_path):
    """The app's path: the tools' settings go to the engine thread, a call there asks the UI, the click
    answers it, an MCP server runs it, and the UI shows the result."""
    import json
    import sys

    from PySide6.QtCore import QTimer

    from app.gui.worker import EngineClient
    from tests.engine.tools.conftest import SERVER_SCRIPT

    client = EngineClient(tmp_path / "history.db")
    try:
        servers = json.dumps({"mcpServers": {"calc": {"command": sys.executable, "args": [str(SERVER_SCRIPT)]}}})
        client.configure_tools(servers, ToolSwitches(frozenset({"calc__add"})))
        turn = threading.Event()
        column = ToolCallColumn(turn)
        qtbot.addWidget(column)
        column.show()
        client.worker.approvals.requested.connect(column.ask)
        client.worker.approvals.finished.connect(column.show_result)
        results = []
        QTimer.singleShot(0, client.worker, lambda: results.append(
            client.worker.toolbox_for_turn(turn).run(ToolCall("c1", "calc__add", {"a": 2, "b": 40}))))
        qtbot.waitUntil(lambda: "c1" in column.blocks)
        with qtbot.waitSignal(client.worker.tool_allowed_always) as always:
            qtbot.mouseClick(column.blocks["c1"].buttons[Decision.ALWAYS], Qt.MouseButton.LeftButton)
        assert always.args == ["calc__add"]
        qtbot.waitUntil(lambda: bool(results) and column.blocks["c1"].result.isVisible(), timeout=30_000)
        assert results[0].content == "42" and column.blocks["c1"].result.text() == "42"
    finally:
        client.close()


def test_the_file_picked_for_the_tools_is_the_open_chats_only(qtbot, tmp_path):
    from PySide6.QtCore import QTimer

    from app.gui.worker import EngineClient
    from engine.tools.builtin import READ_FILE

    picked = tmp_path / "notes.txt"
    picked.write_text("picked text")
    client = EngineClient(tmp_path / "history.db")
    try:
        client.configure_tools("", ToolSwitches(frozenset({READ_FILE}), frozenset({READ_FILE})))
        client.pick_file(str(picked))
        results = []

        def read_on_engine_thread():
            turn = client.worker.toolbox_for_turn(threading.Event())
            QTimer.singleShot(0, client.worker, lambda: results.append(turn.run(ToolCall("r", READ_FILE, {}))))

        read_on_engine_thread()
        qtbot.waitUntil(lambda: len(results) == 1)
        assert results[0].content.endswith("picked text")
        client.open_conversation(None)  # another chat: the file is not its
        read_on_engine_thread()
        qtbot.waitUntil(lambda: len(results) == 2)
        assert results[1].is_error and results[1].content == "no built-in tool read_file is available"
    finally:
        client.close()


def test_the_panel_shows_the_latest_turns_calls_and_hides_without_any(qtbot):
    from app.gui.tool_call_block import ToolCallsPanel

    panel = ToolCallsPanel()
    qtbot.addWidget(panel)
    assert panel.isHidden()
    first, second, stopped = threading.Event(), threading.Event(), threading.Event()
    panel.ask(PendingApproval(ToolCall("a", "echo", {}), first))
    assert not panel.isHidden() and list(panel.column.blocks) == ["a"]
    panel.show_result(ToolCall("b", "echo", {}), ToolResult("b", "ran"), second)  # an always-allowed call
    assert panel.column.turn is second and list(panel.column.blocks) == ["b"]
    stopped.set()
    panel.ask(PendingApproval(ToolCall("c", "echo", {}), stopped))  # answered by the stop: not shown
    assert panel.column.turn is second
    panel.clear()
    assert panel.isHidden() and panel.column is None
