"""A turn that calls a tool, through the window on the Qwen2.5 starter: the call is shown and waits for the
user's answer, the tool runs on an Allow (or not, on a Deny), the model answers its result, and the chat keeps
the call and the result in the history; a tool server that crashes mid-call is a failed result the chat shows
and goes on after. A turn stopped mid-round keeps its call and result (or that it was stopped) in the chat."""

import json
import sys

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel

from engine.tools import STOPPED
from engine.tools.approval import Decision
from engine.tools.builtin import READ_FILE
from engine.tools.toolbox import ToolSwitches
from tests.app.gui.conftest import TURN_TIMEOUT_MS
from tests.engine.tools.conftest import SERVER_SCRIPT

SECRET = "The secret word is marmalade."
ASK = "Read the file notes.txt with the read_file tool and tell me the secret word."


@pytest.fixture
def gui_model(model_path):
    return model_path("qwen2.5-coder-0.5b-instruct")


@pytest.fixture
def tool_window(qtbot, open_window, tmp_path):
    """A window whose read_file tool is switched on (asked about before each call) and may read notes.txt."""
    window = open_window()
    window.apply_settings({"system_prompt": None, "sampler": {"temperature": 0.0, "max_tokens": 48}})
    window.preferences.tool_switches = ToolSwitches(frozenset({READ_FILE}))
    window.configure_tools()
    window.tool_choice.options["required"].trigger()  # a call first: the small model's own choice varies
    notes = tmp_path / "notes.txt"
    notes.write_text(SECRET, encoding="utf-8")
    window.pick_file_for_tools(str(notes))
    return window


def ask_and_answer(qtbot, window, decision: Decision):
    """Send ASK, click `decision`'s button on each call's block as it asks (the model may call again after
    its first result), and wait for the turn to end; the first call's block."""
    window.composer.input.setPlainText(ASK)
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    panel, answered = window.tool_calls, set()

    def asking():
        blocks = panel.column.blocks.values() if panel.column is not None else ()
        return next((b for b in blocks if b.buttons[decision].isVisible() and b.call.id not in answered), None)

    while True:
        qtbot.waitUntil(lambda: asking() is not None or not window.streaming, timeout=TURN_TIMEOUT_MS)
        block = asking()
        if block is None:
            break
        assert block.call.name == READ_FILE
        assert window.streaming  # the engine waits for the answer; the window does not
        answered.add(block.call.id)
        qtbot.mouseClick(block.buttons[decision], Qt.MouseButton.LeftButton)
    assert answered, "the model made no call"
    return next(iter(panel.column.blocks.values()))


def stored_turn(window, name=READ_FILE):
    user, calling, tool, *_, answer = window.store.active_branch(window.current_id)
    assert (user["role"], calling["role"], tool["role"], answer["role"]) == ("user", "assistant", "tool", "assistant")
    [call] = calling["tool_calls"]
    assert call["name"] == name and tool["tool_result"]["call_id"] == call["id"]
    return tool, answer


def test_an_allowed_call_runs_and_the_chat_keeps_it(qtbot, tool_window):
    streamed = []  # the reply text the window is sent as it streams: the call shows as a card, not as markup
    tool_window.client.worker.reply_text.connect(lambda piece, turn: streamed.append(piece))
    block = ask_and_answer(qtbot, tool_window, Decision.ALLOW)
    streamed = "".join(streamed)
    assert tool_window.tool_calls.isHidden()  # the turn ended: its call is in the chat, with how long it took
    assert "marmalade" in block.result.text() and block.status.text().startswith("Done")
    tool, answer = stored_turn(tool_window)
    assert "marmalade" in tool["content"] and not tool["tool_result"]["is_error"]
    assert answer["content"].strip()  # the model answered the result
    assert "tool_call>" not in streamed and answer["content"].strip() in streamed
    shown = [(w.role, w.content) for w in tool_window.chat_view.widgets]
    assert any(role == "tool" and "marmalade" in content for role, content in shown)
    card = next(w for w in tool_window.chat_view.widgets if w.role == "tool")
    assert f"{READ_FILE} · {tool['tool_result']['seconds']:.2f} s" in card.findChild(QLabel, "roleLabel").text()
    assert tool_window.store.search("marmalade")  # the result is searchable


def test_a_denied_call_is_an_error_the_model_reads(qtbot, tool_window):
    block = ask_and_answer(qtbot, tool_window, Decision.DENY)
    assert block.status.text().startswith("Denied")
    tool, _ = stored_turn(tool_window)
    assert tool["tool_result"]["is_error"] and "did not allow" in tool["content"]
    assert "marmalade" not in tool["content"]


@pytest.mark.parametrize("answer", [None, Decision.ALLOW], ids=["while-it-asks", "after-it-ran"])
def test_a_turn_stopped_mid_round_keeps_its_call_in_the_reopened_chat(qtbot, tool_window, answer):
    window = tool_window
    window.composer.input.setPlainText(ASK)
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    panel = window.tool_calls
    qtbot.waitUntil(lambda: panel.column is not None and bool(panel.column.blocks), timeout=TURN_TIMEOUT_MS)
    block = next(iter(panel.column.blocks.values()))
    if answer is not None:
        qtbot.mouseClick(block.buttons[answer], Qt.MouseButton.LeftButton)
        qtbot.waitUntil(block.result.isVisible, timeout=TURN_TIMEOUT_MS)  # the model answers the result now
    qtbot.mouseClick(window.composer.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not window.streaming, timeout=TURN_TIMEOUT_MS)
    assert block.status.text().startswith("Done" if answer else "Stopped")
    conversation = window.current_id
    window.new_chat()
    window.open_conversation(conversation)
    _, calling, tool, *_ = window.store.active_branch(conversation)
    call = calling["tool_calls"][0]
    assert call["name"] == READ_FILE and tool["tool_result"]["call_id"] == call["id"]
    assert ("marmalade" in tool["content"]) if answer else tool["content"] == STOPPED
    shown = [(w.role, w.content) for w in window.chat_view.widgets]
    assert ("tool", tool["content"]) in shown and shown[1][0] == "assistant"


def test_an_mcp_server_that_crashes_mid_call_is_a_failed_result_and_the_chat_is_kept(qtbot, open_window):
    window = open_window()
    window.apply_settings({"system_prompt": None, "sampler": {"temperature": 0.0, "max_tokens": 48}})
    window.preferences.mcp_servers = json.dumps(
        {"mcpServers": {"calc": {"command": sys.executable, "args": [str(SERVER_SCRIPT)]}}})
    window.preferences.tool_switches = ToolSwitches(frozenset({"calc__crash"}), frozenset({"calc__crash"}))
    window.configure_tools()
    window.tool_choice.options["calc__crash"].trigger()
    window.composer.input.setPlainText("Crash the calculator.")
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not window.streaming, timeout=TURN_TIMEOUT_MS)
    block = next(iter(window.tool_calls.column.blocks.values()))
    assert block.status.text().startswith("Failed") and 'MCP server "calc"' in block.result.text()
    tool, answer = stored_turn(window, "calc__crash")
    assert tool["tool_result"]["is_error"] and 'MCP server "calc"' in tool["content"]
    shown = [(w.role, w.content) for w in window.chat_view.widgets]
    assert ("tool", tool["content"]) in shown and answer["role"] == "assistant"
