"""A stop in the middle of a stored chat's tool round (ChatSession.with_tools) keeps what happened, as the
uninterrupted round stores it up to there: the reply with its calls, a tool message per call (one the stop
came before says so) and the reply to the results so far; a reopened chat has them, and so does its next
prompt. A tiny random model with scripted replies makes two calls in one reply (no starter model does), so
a stop can come between them."""

import threading

import pytest

from engine.chat.tool_rounds import ToolRan
from engine.history.store import HistoryStore
from engine.serving.session import ChatSession
from engine.tools import STOPPED, ToolResult, ToolSpec
from engine.tools.approval import AskingToolbox, Decision
from engine.tools.toolbox import CombinedToolbox, ToolSwitches
from tests.engine.chat.conftest import Script, write_tiny_chatml_model

GREEDY = {"temperature": 0.0, "max_tokens": 200, "ctx": 1024}
WEATHER = ToolSpec("get_weather", "The weather in a city now",
                   {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
CALLS = "".join(f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>\n'
                for city in ("Oslo", "Paris"))
ANSWER = "Drizzle in Oslo, sun in Paris."


class Weather:
    """The tool; `running(call)` happens while a call runs (a Stop pressed meanwhile)."""

    def __init__(self, running=lambda call: None):
        self.running = running

    def specs(self):
        return [WEATHER]

    def run(self, call):
        self.running(call)
        return ToolResult(call.id, f"Weather in {call.arguments['city']}: mild", seconds=0.5)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.models import load_model

    return load_model(write_tiny_chatml_model(tmp_path_factory.mktemp("tools") / "tiny-chatml.gguf"))


def tool_turn(tiny, path, toolbox, cancel=None, *, stop_in_answer=None) -> ChatSession:
    """A turn whose reply calls the weather in Oslo and Paris, then answers the results (stopped after
    `stop_in_answer` pieces of the answer, if given); the chat, reopened by a fresh session."""
    store = HistoryStore(path / "history.db")
    session = ChatSession.open(store, tiny, sidecar_dir=path / "sidecars", sampler=GREEDY)
    tokenizer = session.convo.tokenizer
    end = tokenizer.token_id("<|im_end|>")

    def start():
        # the script in place of the tools' constraint with_tools has just set ("auto" keeps it every round)
        session.convo.sampler.processor = Script(*[tokenizer.encode(r, add_special=False) + [end]
                                                   for r in (CALLS, ANSWER)])
        return session.send("What is the weather in Oslo and in Paris?", cancel)

    ran = answered = 0
    for piece in session.with_tools(start, toolbox, cancel):
        ran += isinstance(piece, ToolRan)
        answered += ran == 2 and isinstance(piece, str)
        if answered == stop_in_answer:
            cancel.set()
    session.close()
    store.close()
    return ChatSession(HistoryStore(path / "history.db"), tiny, session.id, sidecar_dir=path / "sidecars")


def shape(messages: list[dict]) -> list[tuple]:
    """What the messages say, each call's id by its place in the turn (a call's id is random)."""
    ids = [c["id"] for m in messages for c in m["tool_calls"]]
    return [(m["role"], m["content"], [(ids.index(c["id"]), c["name"], c["arguments"]) for c in m["tool_calls"]],
             m["tool_result"] and (ids.index(m["tool_result"]["call_id"]), m["tool_result"]["name"],
                                   m["tool_result"]["is_error"]))
            for m in messages]


def stopped(message: tuple) -> tuple:
    """A tool message as it is stored when the stop came before its call ran."""
    role, _, calls, (call, name, _) = message
    return role, STOPPED, calls, (call, name, True)


@pytest.fixture(scope="module")
def uninterrupted(tiny, tmp_path_factory):
    messages = shape(tool_turn(tiny, tmp_path_factory.mktemp("uninterrupted"), Weather()).messages())
    assert [m[0] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert len(messages[1][2]) == 2 and messages[4][1] == ANSWER
    return messages


def test_a_stop_while_a_call_runs_keeps_its_result_and_the_next_call_is_stopped(tiny, tmp_path, uninterrupted):
    cancel = threading.Event()
    session = tool_turn(tiny, tmp_path, Weather(running=lambda call: cancel.set()), cancel)
    assert shape(session.messages()) == [*uninterrupted[:3], stopped(uninterrupted[3])]
    session.store.add_message(session.id, "user", "And tomorrow?")
    prompt = session.convo.tokenizer.decode(session._window(session.messages())[0].ids)
    assert "Weather in Oslo: mild" in prompt and STOPPED in prompt and '"city": "Paris"' in prompt


def test_a_stop_while_a_call_waits_for_its_approval_stops_it_and_the_rest(tiny, tmp_path, uninterrupted):
    cancel = threading.Event()

    def stop_while_asking(call):  # as the app's approval answers a turn stopped before the user did
        cancel.set()
        return Decision.STOP

    asking = AskingToolbox(CombinedToolbox([Weather()], ToolSwitches(frozenset({"get_weather"}))), stop_while_asking)
    expected = [*uninterrupted[:2], stopped(uninterrupted[2]), stopped(uninterrupted[3])]
    assert shape(tool_turn(tiny, tmp_path, asking, cancel).messages()) == expected


def test_a_stop_while_the_model_answers_the_results_keeps_the_answer_so_far(tiny, tmp_path, uninterrupted):
    messages = shape(tool_turn(tiny, tmp_path, Weather(), threading.Event(), stop_in_answer=5).messages())
    assert messages[:4] == uninterrupted[:4]
    answer = messages[4]
    assert answer[0] == "assistant" and answer[1] and ANSWER.startswith(answer[1]) and answer[1] != ANSWER
