"""The server's reasoning fields on a tiny random model with Qwen3's markers and scripted replies (no
starter model reasons): reasoning_content apart from content in replies and streamed deltas, the same
whole or streamed, reasoning_effort reaching the template, and completions left raw; the Responses API's
reasoning item and the Messages API's thinking blocks, read by the official clients."""

import json

import anthropic
import openai
import pytest
from starlette.testclient import TestClient

import engine.serving.service as service_module
from app.server import create_app
from engine.chat import ChatOptions, JinjaTemplate
from engine.chat.reasoning import Thought
from engine.serving.service import EngineService
from tests.engine.chat.conftest import Script
from tests.engine.chat.reasoning_model import write_reasoning_model

REASONING, ANSWER = "Two and two make four.", "4"
USER = [{"role": "user", "content": "2+2?"}]


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    from engine.models import load_model

    return load_model(write_reasoning_model(tmp_path_factory.mktemp("think") / "thinker.gguf"))


@pytest.fixture
def client(thinker, tmp_path, monkeypatch):
    """A server whose every reply is the scripted reasoning and answer."""
    service = EngineService(thinker, slots=1, capacity=256, sidecar_dir=tmp_path / "slots")
    tok = service.tokenizer
    reply = tok.encode(f"<think>\n{REASONING}\n</think>\n\n{ANSWER}", add_special=False) + [tok.token_id("<|im_end|>")]
    monkeypatch.setattr(service_module, "ChatOptions", lambda **kw: ChatOptions(**kw, processor=Script(reply)))
    with TestClient(create_app(service, ["thinker"])) as c:
        c.service = service
        yield c
    service.close()


def post(client, path="/v1/chat/completions", **fields):
    return client.post(path, json={"model": "thinker", "messages": USER, "max_tokens": 40} | fields)


def test_a_reply_carries_its_reasoning_apart(client):
    r = post(client)
    assert r.status_code == 200
    message = r.json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": ANSWER, "reasoning_content": REASONING}


def test_streamed_deltas_carry_reasoning_then_content_and_add_up_to_the_whole_reply(client):
    with client.stream("POST", "/v1/chat/completions",
                       json={"model": "thinker", "messages": USER, "max_tokens": 40, "stream": True}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    fields = [k for d in deltas for k in d if k in ("content", "reasoning_content") and d[k]]
    assert fields == sorted(fields, reverse=True)  # every reasoning delta before the first content one
    assert "".join(d.get("reasoning_content", "") for d in deltas) == REASONING
    assert "".join(d.get("content", "") for d in deltas) == ANSWER


def test_a_past_replys_reasoning_is_taken_and_an_unknown_effort_refused(client):
    history = USER + [{"role": "assistant", "content": ANSWER, "reasoning_content": REASONING},
                      {"role": "user", "content": "and 3+3?"}]
    assert post(client, messages=history).status_code == 200
    bad = post(client, reasoning_effort="extreme")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"
    misplaced = post(client, messages=[{"role": "user", "content": "x", "reasoning_content": "y"}])
    assert misplaced.status_code == 400


def test_reasoning_effort_reaches_the_template(client):
    client.service.template = JinjaTemplate(
        "{{ 'Reasoning: ' + (reasoning_effort or 'default') + '\\n' }}"
        "{%- for m in messages %}{{ m.content }}{% endfor %}</think>", isolated=False)
    low, medium = (post(client, reasoning_effort=e).json()["usage"]["prompt_tokens"] for e in ("low", "medium"))
    assert medium == low + 3  # one token a byte in this vocabulary (whose only merge is "hi")


def test_a_completion_continues_the_raw_text(client):
    r = client.post("/v1/completions", json={"model": "thinker", "prompt": "Q: 2+2?\nA:", "max_tokens": 40})
    assert r.json()["choices"][0]["text"] == f"<think>\n{REASONING}\n</think>\n\n{ANSWER}"


def test_a_remote_chat_gets_the_reasoning_apart(client):
    from engine.chat import Message
    from engine.serving.remote import RemoteClient
    from tests.serving import serving_app

    with serving_app(client.app) as url:
        reply = RemoteClient(url, model="thinker").stream_chat([Message("user", "2+2?")], {"max_tokens": 40})
        pieces = list(reply)
    assert "".join(p for p in pieces if isinstance(p, Thought)) == REASONING
    assert (reply.turn.text, reply.turn.reasoning) == (ANSWER, REASONING)


def test_the_responses_api_gives_the_reasoning_as_an_item(client):
    responses = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client,
                              max_retries=0).responses
    reply = responses.create(model="thinker", input="2+2?", max_output_tokens=40, reasoning={"effort": "low"})
    assert [item.type for item in reply.output] == ["reasoning", "message"]
    assert (reply.output[0].content[0].text, reply.output_text) == (REASONING, ANSWER)
    with responses.stream(model="thinker", input="2+2?", max_output_tokens=40) as stream:
        deltas = [e.delta for e in stream if e.type == "response.reasoning_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == REASONING and final.output_text == ANSWER


def test_the_messages_api_gives_the_reasoning_as_thinking_blocks(client):
    messages = anthropic.Anthropic(base_url="http://testserver", api_key="unused", http_client=client,
                                   max_retries=0).messages
    thinking = {"type": "enabled", "budget_tokens": 39}
    reply = messages.create(model="thinker", max_tokens=40, messages=USER, thinking=thinking)
    blocks = [("thinking", REASONING), ("text", ANSWER)]
    assert [(b.type, getattr(b, "thinking", None) or b.text) for b in reply.content] == blocks
    with messages.stream(model="thinker", max_tokens=40, messages=USER, thinking=thinking) as stream:
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "thinking", None) or b.text) for b in final.content] == blocks
    off = messages.create(model="thinker", max_tokens=40, messages=USER, thinking={"type": "disabled"})
    prompt = [r.usage.input_tokens + r.usage.cache_read_input_tokens for r in (reply, off)]
    assert prompt[1] > prompt[0]  # the prompt closes the reasoning (the scripted reply reasons all the same)
