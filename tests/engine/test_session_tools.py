"""Tool rounds in a stored chat (ChatSession.with_tools) on the real default model: every reply is stored with
its calls and every result as a tool message, a failing tool is a result the chat keeps going with, and a
reopened chat renders the calls and results for the model again."""

from engine.chat.tool_rounds import ToolRan
from engine.serving.session import ChatSession
from engine.tools import ToolResult, ToolSpec
from engine.tools.toolbox import CombinedToolbox, ToolSwitches

SAMPLER = {"temperature": 0.0, "max_tokens": 40, "ctx": 1024}
WEATHER = ToolSpec("get_weather", "The weather in a city now",
                   {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})


class Weather:
    def __init__(self, fail: bool = False):
        self.fail, self.calls = fail, []

    def specs(self):
        return [WEATHER]

    def run(self, call):
        self.calls.append(call)
        if self.fail:  # a server gone mid-call: CombinedToolbox turns it into an error result
            raise ConnectionError("the weather server closed the connection")
        return ToolResult(call.id, "Drizzle, 4 degrees", seconds=0.01)


def tool_turn(session, toolbox):
    stream = session.with_tools(lambda: session.send("What is the weather in Oslo?"), toolbox, choice="required")
    return [piece for piece in stream if isinstance(piece, ToolRan)]


def test_calls_and_results_are_stored_as_they_happen(smollm2, home):
    store, sidecars = home
    s = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=SAMPLER)
    tool = Weather()
    ran = tool_turn(s, tool)
    assert ran and tool.calls and ran[0].call == tool.calls[0]
    _, calling, result, *rest = s.messages()
    assert calling["tool_calls"][0] == {"id": ran[0].call.id, "name": "get_weather", "arguments": ran[0].call.arguments}
    assert (result["role"], result["content"], result["tool_result"]["call_id"]) == (
        "tool", "Drizzle, 4 degrees", ran[0].call.id)
    assert rest and rest[-1]["role"] == "assistant"
    assert s.convo.options.tools is None  # the next reply without tools renders as before


def test_a_failing_tool_is_an_error_result_and_the_chat_goes_on(smollm2, home):
    store, sidecars = home
    s = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=SAMPLER)
    failing = CombinedToolbox([Weather(fail=True)], ToolSwitches(frozenset({"get_weather"})))
    [first, *_] = tool_turn(s, failing)
    assert first.result.is_error and "closed the connection" in first.result.content
    stored = s.messages()[2]
    assert stored["tool_result"]["is_error"] and "closed the connection" in stored["content"]
    assert "".join(s.send("Thanks. And tomorrow?")) is not None  # the conversation is still usable
    assert s.messages()[-2]["content"] == "Thanks. And tomorrow?"


def test_a_reopened_chat_renders_its_calls_and_results_again(smollm2, home):
    store, sidecars = home
    s = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=SAMPLER)
    tool_turn(s, Weather())
    s.close()
    reopened = ChatSession.open(store, smollm2, s.id, sidecar_dir=sidecars)
    store.add_message(s.id, "user", "And tomorrow?")
    window, _ = reopened._window(reopened.messages())
    prompt = reopened.convo.tokenizer.decode(window.ids)
    assert "Drizzle, 4 degrees" in prompt and '"name": "get_weather"' in prompt
    assert "".join(reopened.regenerate())  # the next reply follows them
