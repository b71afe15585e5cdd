"""The app's toolbox for its chats: MCP servers and built-in tools, reconfigured as the settings change."""

from engine.history.store import HistoryStore
from engine.tools import ToolCall
from engine.tools.approval import Decision
from engine.tools.builtin import READ_DOCUMENT, READ_FILE, SEARCH_CONVERSATIONS
from engine.tools.chat_toolbox import ChatToolbox
from engine.tools.toolbox import ToolSwitches
from tests.engine.tools.conftest import stdio_server


def test_servers_and_built_ins_behind_the_switches_and_the_question(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("attached text")
    with HistoryStore(tmp_path / "history.db") as store:
        chat = store.create_conversation("model.gguf")
        store.add_attachment(chat, "doc.txt", "text", str(doc))
    tools = ChatToolbox(tmp_path / "history.db", lambda: chat, timeout=20)
    asked = []

    def ask(call):
        asked.append(call.name)
        return Decision.DENY if call.name == READ_DOCUMENT else Decision.ALLOW

    try:
        tools.configure({"a": stdio_server("a")}, ToolSwitches(frozenset({"a__echo", READ_DOCUMENT}),
                                                                frozenset({"a__echo"})))
        turn = tools.asking(ask)
        assert [s.name for s in turn.specs()] == ["a__echo", READ_DOCUMENT]
        assert turn.run(ToolCall("1", "a__echo", {"text": "x"})).content == "echo: x"
        assert turn.run(ToolCall("2", READ_DOCUMENT, {"name": "doc.txt"})).is_error
        assert asked == [READ_DOCUMENT]  # a__echo is always allowed
        assert turn.run(ToolCall("3", READ_FILE, {})).content == "the tool read_file is switched off"

        tools.configure({"b": stdio_server("b")}, ToolSwitches(frozenset({"b__echo"}), frozenset({"b__echo"})))
        assert turn.run(ToolCall("4", "b__echo", {"text": "y"})).content == "echo: y"
        assert turn.run(ToolCall("5", "a__echo", {"text": "y"})).is_error  # the server a is gone
    finally:
        tools.close()


def test_a_turn_offers_only_the_tools_its_chat_keeps_on_and_refuses_the_others_unasked(tmp_path):
    tools = ChatToolbox(tmp_path / "history.db", lambda: None)
    asked = []
    try:
        tools.configure({}, ToolSwitches(frozenset({READ_FILE, SEARCH_CONVERSATIONS})))
        tools.picked.pick(str(tmp_path / "notes.txt"))  # read_file is listed once a file is picked
        turn = tools.asking(lambda call: asked.append(call.name) or Decision.ALLOW, enabled=frozenset({READ_FILE}))
        assert [s.name for s in turn.specs()] == [READ_FILE]
        result = turn.run(ToolCall("1", SEARCH_CONVERSATIONS, {"query": "x"}))
        assert result.is_error and result.content == f"the tool {SEARCH_CONVERSATIONS} is switched off in this chat"
        assert asked == []
        assert {s.name for s in tools.asking(asked.append).specs()} == {READ_FILE, SEARCH_CONVERSATIONS}
    finally:
        tools.close()
