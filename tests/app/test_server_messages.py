"""Anthropic's Messages API (/v1/messages) on SmolLM2, through the official anthropic client: a plain
reply, a tool_use call held to its input_schema and answered with a tool_result, streams read with
`client.messages.stream` (text, and a call's input_json_delta), the stop sequence that ended a reply named
whole and streamed, and errors in Anthropic's shape (a missing max_tokens, a bad key, a bad block).
Thinking needs a reasoning model: tests/app/test_server_reasoning.py."""

import anthropic
import jsonschema
import pytest

from tests.app.conftest import API_KEY, SMOLLM2

WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                            "required": ["city"], "additionalProperties": False}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"extra_body": {"temperature": 0}}  # the API takes it; this client's signature no longer names it


def anthropic_client(http, key=API_KEY):
    return anthropic.Anthropic(base_url="http://testserver", api_key=key, http_client=http, max_retries=0)


@pytest.fixture(scope="module")
def client(smollm2_server):
    return anthropic_client(smollm2_server)


def test_a_plain_reply(client):
    reply = client.messages.create(model=SMOLLM2, max_tokens=10, system="Answer in one short sentence.",
                                   messages=[{"role": "user", "content": "Say hello."}], **GREEDY)
    assert reply.type == "message" and reply.role == "assistant"
    assert [b.type for b in reply.content] == ["text"] and reply.content[0].text
    assert reply.stop_reason in ("end_turn", "max_tokens") and 0 < reply.usage.output_tokens <= 10


def test_a_tool_use_holds_to_its_schema_and_its_result_is_read(client):
    reply = client.messages.create(model=SMOLLM2, max_tokens=60, messages=QUESTION, tools=[WEATHER],
                                   tool_choice={"type": "tool", "name": "get_weather"}, **GREEDY)
    calls = [b for b in reply.content if b.type == "tool_use"]
    assert reply.stop_reason == "tool_use" and calls and calls[0].name == "get_weather"
    jsonschema.validate(calls[0].input, WEATHER["input_schema"])

    answered = QUESTION + [{"role": "assistant", "content": [b.model_dump() for b in reply.content]},
                           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                                         "content": "18 degrees"}]}]
    after = client.messages.create(model=SMOLLM2, max_tokens=8, messages=answered, tools=[WEATHER],
                                   tool_choice={"type": "none"}, **GREEDY)
    assert after.stop_reason in ("end_turn", "max_tokens") and [b.type for b in after.content] == ["text"]


def test_a_streamed_reply_adds_up_to_the_final_message(client):
    with client.messages.stream(model=SMOLLM2, max_tokens=8, messages=[{"role": "user", "content": "Say hi."}],
                                **GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text and final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.output_tokens > 0


def test_a_streamed_tool_use_comes_as_input_json_deltas(client):
    with client.messages.stream(model=SMOLLM2, max_tokens=60, messages=QUESTION, tools=[WEATHER],
                                tool_choice={"type": "any"}, **GREEDY) as stream:
        kinds = [(event.type, getattr(getattr(event, "delta", None), "type", None)) for event in stream]
        final = stream.get_final_message()
    assert kinds[0][0] == "message_start" and ("content_block_delta", "input_json_delta") in kinds
    call = final.content[-1]
    assert final.stop_reason == "tool_use" and call.type == "tool_use" and call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER["input_schema"])


def test_the_stop_sequence_that_ended_the_reply_is_named(client):
    # greedy, SmolLM2 answers "The numbers 1, 2, 3, 4, 5 are ..."; the first sequence never comes
    count = {"model": SMOLLM2, "max_tokens": 30, "stop_sequences": ["never said", ", 3"],
             "messages": [{"role": "user", "content": "Write the numbers 1, 2, 3, 4, 5."}]}
    reply = client.messages.create(**count, **GREEDY)
    with client.messages.stream(**count, **GREEDY) as stream:
        deltas = [event.delta for event in stream if event.type == "message_delta"]
        final = stream.get_final_message()
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == ", 3"
    assert [(d.stop_reason, d.stop_sequence) for d in deltas] == [("stop_sequence", ", 3")]
    assert final.stop_sequence == ", 3" and final.content[0].text == reply.content[0].text
    assert "1, 2" in reply.content[0].text and "3" not in reply.content[0].text
    plain = client.messages.create(**count | {"stop_sequences": ["never said"], "max_tokens": 4}, **GREEDY)
    assert plain.stop_reason == "max_tokens" and plain.stop_sequence is None


def test_errors_have_anthropics_shape(smollm2_server, client):
    with pytest.raises(anthropic.BadRequestError) as e:  # the client's create() refuses to send it
        client.post("/v1/messages", cast_to=object, body={"model": SMOLLM2, "messages": QUESTION})
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic_client(smollm2_server, key="wrong").messages.create(model=SMOLLM2, messages=QUESTION, max_tokens=4)
    assert e.value.body["error"]["type"] == "authentication_error"


BAD = {  # name: (fields, words the message holds)
    "a tool_result answering no call": ({"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_x", "content": "18"}]}]}, "tool_use_id"),
    "an image block": ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
                       "text or tool_result"),
    "a system role": ({"messages": [{"role": "system", "content": "x"}]}, "role"),
    "a server tool": ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools"),
    "tool_choice any without tools": ({"tool_choice": {"type": "any"}}, "tool_choice"),
    "a budget past max_tokens": ({"thinking": {"type": "enabled", "budget_tokens": 8}}, "thinking"),
    "a temperature above 1": ({"temperature": 1.5}, "temperature"),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_input_gets_a_400_saying_what(smollm2_server, name):
    fields, words = BAD[name]
    r = smollm2_server.post("/v1/messages", headers={"x-api-key": API_KEY},
                            json={"model": SMOLLM2, "messages": QUESTION, "max_tokens": 4} | fields)
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error" and words in r.json()["error"]["message"]
