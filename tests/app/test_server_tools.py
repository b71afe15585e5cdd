"""Tools on /v1/chat/completions: the official openai client on SmolLM2, a call returned whole (message.tool_calls,
finish_reason tool_calls) and streamed (tool-call deltas), tool results sent back as `tool` messages; and
every bad tools, tool_choice or tool message answered with a 400 naming the field."""

import json

import jsonschema
import openai
import pytest
from starlette.testclient import TestClient

from app.server import create_app
from engine.serving.service import EngineService

NAME = "smollm2-135m-instruct"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def served(model_path, tmp_path_factory):
    from engine.models import load_model

    service = EngineService(load_model(model_path(NAME)), slots=1, capacity=1024,
                            sidecar_dir=tmp_path_factory.mktemp("slots"))
    http = TestClient(create_app(service, [NAME]))
    yield http, openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0)
    http.close()
    service.close()


def test_a_call_comes_back_whole_and_its_result_is_read(served):
    _, client = served
    reply = client.chat.completions.create(model=NAME, messages=QUESTION, tools=[WEATHER, TIME], max_tokens=60,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                           temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    assert "<tool_call>" not in (choice.message.content or "")

    answered = QUESTION + [choice.message.model_dump(exclude_none=True),
                           {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'}]
    after = client.chat.completions.create(model=NAME, messages=answered, tools=[WEATHER], tool_choice="none",
                                           max_tokens=12, temperature=0)
    assert after.choices[0].finish_reason in ("stop", "length") and not after.choices[0].message.tool_calls
    assert after.choices[0].message.content
    alone = client.chat.completions.create(model=NAME, messages=QUESTION, max_tokens=1)
    assert after.usage.prompt_tokens > alone.usage.prompt_tokens + 10  # the call and its result were rendered


def test_a_streamed_call_comes_as_tool_call_deltas(served):
    _, client = served
    chunks = list(client.chat.completions.create(model=NAME, messages=QUESTION, tools=[WEATHER],
                                                 tool_choice="required", max_tokens=60, seed=5, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert "<tool_call" not in content and deltas
    calls: dict[int, dict] = {}
    for d in deltas:  # as clients accumulate them
        call = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
        call["id"] += d.id or ""
        call["name"] += d.function.name or ""
        call["arguments"] += d.function.arguments or ""
    assert [c["name"] for c in calls.values()] == ["get_weather"] * len(calls)
    for call in calls.values():
        jsonschema.validate(json.loads(call["arguments"]), WEATHER["function"]["parameters"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


BAD = {  # name: (fields, the param the error names)
    "tools not an array": ({"tools": {"name": "f"}}, "tools"),
    "a tool without a name": ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools"),
    "a tool name with spaces": ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools"),
    "parameters no schema": ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
                             "tools"),
    "two tools of one name": ({"tools": [WEATHER, WEATHER]}, "tool_choice"),
    "tool_choice an unknown tool": ({"tools": [WEATHER], "tool_choice": {"type": "function",
                                                                         "function": {"name": "nope"}}}, "tool_choice"),
    "tool_choice a word": ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
    "tool_choice without tools": ({"tool_choice": "required"}, "tool_choice"),
    "tools with a response format": ({"tools": [WEATHER], "response_format": {"type": "json_object"}},
                                     "response_format"),
    "a tool message answering no call": ({"messages": QUESTION + [{"role": "tool", "tool_call_id": "call_x",
                                                                   "content": "18"}]}, "messages[1].tool_call_id"),
    "tool_calls on a user message": ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
                                     "messages[0].tool_calls"),
    "arguments not JSON": ({"messages": QUESTION + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
        "messages[1].tool_calls[0].function.arguments"),
    "functions (legacy)": ({"functions": [WEATHER["function"]]}, "functions"),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_tools_get_a_400_naming_the_field(served, name):
    http, _ = served
    fields, param = BAD[name]
    r = http.post("/v1/chat/completions", json={"model": NAME, "messages": QUESTION, "max_tokens": 4} | fields)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"]


def test_tools_on_a_completion_are_refused(served):
    http, _ = served
    r = http.post("/v1/completions", json={"model": NAME, "prompt": "Hi", "tools": [WEATHER]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
