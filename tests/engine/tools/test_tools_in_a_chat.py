"""The two halves of tool use meeting: SmolLM2 writes a call to an MCP server's tool (held to its schema),
the server runs it once the user allows it, and the model reads the server's answer."""

import pytest

from engine.chat import ChatOptions, Conversation
from engine.chat.tool_rounds import ToolRan, send_with_tools
from engine.chat.tool_use import ToolUse
from engine.tools.approval import Decision
from engine.tools.chat_toolbox import ChatToolbox
from engine.tools.toolbox import ToolSwitches
from tests.engine.tools.conftest import stdio_server


@pytest.fixture
def smollm2(model_path):
    from engine.models import load_model
    from engine.tokenize import load_tokenizer

    model = load_model(model_path("smollm2-135m-instruct"))
    return model, load_tokenizer(model.file.metadata)


def test_a_reply_calls_an_mcp_servers_tool_and_reads_its_answer(smollm2, tmp_path):
    model, tokenizer = smollm2
    tools = ChatToolbox(tmp_path / "history.db", lambda: None, timeout=30)
    asked = []
    try:
        tools.configure({"calc": stdio_server("calc")}, ToolSwitches(frozenset({"calc__add"})))
        turn = tools.asking(lambda call: asked.append(call) or Decision.ALLOW)
        offered = tuple(turn.specs())
        assert [s.name for s in offered] == ["calc__add"]
        options = ChatOptions(capacity=1024, max_tokens=60, tools=ToolUse(offered, "required"))
        convo = Conversation.for_model(model, options, tokenizer=tokenizer)
        events = list(send_with_tools(convo, "What is 2 plus 40?", turn, max_rounds=2))
        ran = [e for e in events if isinstance(e, ToolRan)]
        assert ran and [e.call for e in ran] == asked
        call, result = ran[0].call, ran[0].result
        assert call.name == "calc__add" and set(call.arguments) == {"a", "b"}  # the schema held the call
        assert not result.is_error and result.content == str(call.arguments["a"] + call.arguments["b"])
        tool_message = next(m for m in convo.messages if m.role == "tool")
        assert tool_message.content == result.content  # what the server answered went back to the model
    finally:
        tools.close()
