"""OpenAI's Responses API (/v1/responses) on SmolLM2, through the official openai client: a plain reply, a
function call returned whole and answered with a function_call_output, a streamed call read by the client's
own stream accumulator, previous_response_id continuing from the warm cache with the very reply the whole
conversation gets, store: false and unknown ids refused, text.format's structured outputs (json_schema and
json_object) held to their grammar, a stored response read back by id until deleted, and bad input answered
with a 400 naming the field."""

import json

import jsonschema
import openai
import pytest

from tests.app.conftest import API_KEY, SMOLLM2

WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                          "required": ["city"], "additionalProperties": False}}
QUESTION = "What is the weather in Paris?"
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"}}}
INVENT = "Invent a person. Reply with their name and age as JSON."


@pytest.fixture(scope="module")
def client(smollm2_server):
    return openai.OpenAI(base_url="http://testserver/v1", api_key=API_KEY, http_client=smollm2_server,
                         max_retries=0)


def test_a_plain_reply(client):
    reply = client.responses.create(model=SMOLLM2, input="Say hello.", instructions="Answer in one short sentence.",
                                    max_output_tokens=10, temperature=0)
    assert reply.object == "response" and reply.status in ("completed", "incomplete")
    assert [item.type for item in reply.output] == ["message"] and reply.output_text
    assert reply.usage.output_tokens <= 10 and reply.instructions == "Answer in one short sentence."


def test_a_call_comes_back_whole_and_its_output_is_read(client):
    reply = client.responses.create(model=SMOLLM2, input=QUESTION, tools=[WEATHER], max_output_tokens=60,
                                    tool_choice={"type": "function", "name": "get_weather"}, temperature=0)
    calls = [item for item in reply.output if item.type == "function_call"]
    assert reply.status == "completed" and calls and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])

    answered = [{"role": "user", "content": QUESTION}, calls[0].model_dump(exclude_none=True),
                {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temperature": 18}'}]
    after = client.responses.create(model=SMOLLM2, input=answered, tools=[WEATHER], tool_choice="none",
                                    max_output_tokens=8, temperature=0)
    assert after.output_text and not [item for item in after.output if item.type == "function_call"]
    alone = client.responses.create(model=SMOLLM2, input=QUESTION, max_output_tokens=1)
    assert after.usage.input_tokens > alone.usage.input_tokens + 10  # the call and its output were rendered


def test_a_chained_function_call_output_answers_the_stored_call(client):
    reply = client.responses.create(model=SMOLLM2, input=QUESTION, tools=[WEATHER], tool_choice="required",
                                    max_output_tokens=60, temperature=0)
    call = reply.output[-1]
    after = client.responses.create(model=SMOLLM2, previous_response_id=reply.id, tools=[WEATHER],
                                    max_output_tokens=4, temperature=0, input=[
                                        {"type": "function_call_output", "call_id": call.call_id, "output": "18"}])
    assert after.status in ("completed", "incomplete")
    assert after.usage.input_tokens_details.cached_tokens >= reply.usage.input_tokens  # the call's prompt was warm


def test_a_streamed_call_is_read_by_the_clients_accumulator(client):
    with client.responses.stream(model=SMOLLM2, input=QUESTION, tools=[WEATHER], tool_choice="required",
                                 max_output_tokens=60, temperature=0) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    for kind in ("response.output_item.added", "response.function_call_arguments.delta",
                 "response.function_call_arguments.done", "response.output_item.done"):
        assert kind in kinds
    call = final.output[-1]
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])


def test_a_chained_reply_comes_from_the_warm_cache_and_equals_the_whole_conversations(client):
    first = client.responses.create(model=SMOLLM2, input="Name a fruit.", max_output_tokens=8, temperature=0)
    client.responses.create(model=SMOLLM2, input="Count to three.", max_output_tokens=4)  # the other slot's
    chained = client.responses.create(model=SMOLLM2, previous_response_id=first.id, input="Name another one.",
                                      max_output_tokens=8, temperature=0)
    # the first reply's prompt and its tokens were held, not prefilled again
    assert chained.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens + 1
    whole = client.responses.create(model=SMOLLM2, max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Name another one."}])
    assert chained.output_text == whole.output_text and chained.previous_response_id == first.id


def test_a_json_schema_format_holds_the_answer_to_its_schema(client):
    person = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    reply = client.responses.create(model=SMOLLM2, input=INVENT, text={"format": person}, max_output_tokens=80,
                                    temperature=0)
    jsonschema.validate(json.loads(reply.output_text), PERSON)
    assert reply.text.format.model_dump(by_alias=True, exclude_none=True) == person  # the request's format, echoed
    with client.responses.stream(model=SMOLLM2, input=INVENT, text={"format": person}, max_output_tokens=80,
                                 temperature=0) as stream:
        streamed = stream.get_final_response()
    assert streamed.output_text == reply.output_text


def test_a_json_object_format_answers_with_an_object(client):
    reply = client.responses.create(model=SMOLLM2, input=INVENT, text={"format": {"type": "json_object"}},
                                    max_output_tokens=40, temperature=0)
    assert isinstance(json.loads(reply.output_text), dict) and reply.text.format.type == "json_object"


def test_unstored_and_unknown_responses_cannot_be_continued(client):
    unstored = client.responses.create(model=SMOLLM2, input="Hi", max_output_tokens=1, store=False)
    for previous in (unstored.id, "resp_unknown"):
        with pytest.raises(openai.NotFoundError) as e:
            client.responses.create(model=SMOLLM2, previous_response_id=previous, input="Hi", max_output_tokens=1)
        assert e.value.body["code"] == "previous_response_not_found"


def test_a_stored_response_is_read_back_as_created_until_deleted(client, smollm2_server):
    short = {"instructions": "Answer in one word.", "max_output_tokens": 40, "temperature": 0}  # ends well inside 40
    created = client.responses.create(model=SMOLLM2, input="Name a colour.", **short)
    with client.responses.stream(model=SMOLLM2, input="Name a fruit.", **short) as stream:
        streamed = stream.get_final_response()
    assert created.status == streamed.status == "completed"
    assert client.responses.retrieve(created.id).model_dump() == created.model_dump()
    # the stream's accumulator adds a `parsed` field of its own (None) to the text
    assert client.responses.retrieve(streamed.id).model_dump(exclude_none=True) == streamed.model_dump(
        exclude_none=True)
    assert smollm2_server.get(f"/v1/responses/{created.id}").status_code == 401  # no key: as every route

    unstored = client.responses.create(model=SMOLLM2, input="Hi", max_output_tokens=1, store=False)
    for missing in (unstored.id, "resp_unknown"):
        with pytest.raises(openai.NotFoundError) as e:
            client.responses.retrieve(missing)
        assert e.value.body["param"] == "response_id" and e.value.body["code"] == "response_not_found"

    deleted = smollm2_server.delete(f"/v1/responses/{created.id}", headers={"Authorization": f"Bearer {API_KEY}"})
    assert deleted.json() == {"id": created.id, "object": "response.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):  # nor can it be continued
        client.responses.create(model=SMOLLM2, previous_response_id=created.id, input="Hi", max_output_tokens=1)
    client.responses.delete(streamed.id)  # the client's own call
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(streamed.id)


BAD = {  # name: (fields, the param the error names)
    "no input": ({"input": None}, "input"),
    "an item of no known type": ({"input": [{"type": "image", "url": "x"}]}, "input[0]"),
    "an output answering no call": ({"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]},
                                    "input[0].call_id"),
    "arguments not JSON": ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{x"}]},
                           "input[0].arguments"),
    "an unknown effort": ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    "a tool of another kind": ({"tools": [{"type": "web_search"}]}, "tools"),
    "tool_choice without tools": ({"tool_choice": "required"}, "tool_choice"),
    "a format of no known type": ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    "a format not an object": ({"text": {"format": "json_object"}}, "text.format"),
    "a json_schema without its schema": ({"text": {"format": {"type": "json_schema", "name": "p"}}},
                                         "text.format.schema"),
    "a schema not an object": ({"text": {"format": {"type": "json_schema", "name": "p", "schema": "x"}}},
                               "text.format.schema"),
    "a schema no grammar can hold": ({"text": {"format": {"type": "json_schema", "name": "p",
                                                          "schema": {"type": "wizard"}}}}, "text.format"),
    "a format with tools": ({"tools": [WEATHER], "text": {"format": {"type": "json_object"}}}, "text.format"),
    "too many tokens": ({"max_output_tokens": 10**6}, "max_output_tokens"),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_input_gets_a_400_naming_the_field(smollm2_server, name):
    fields, param = BAD[name]
    body = {"model": SMOLLM2, "input": "Hi", "max_output_tokens": 4} | fields
    r = smollm2_server.post("/v1/responses", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
