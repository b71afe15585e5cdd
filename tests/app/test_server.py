"""The OpenAI-compatible server in-process (Starlette's TestClient, an httpx client) on a tiny random model:
the endpoints' shapes, streaming, per-request settings, cached_tokens, and every bad request answered with
an OpenAI-shaped 4xx error while the server goes on serving."""

import json

import jsonschema
import pytest
from starlette.testclient import TestClient

from app.server import create_app
from app.server_requests import Limits
from engine.serving.service import EngineService

CONTEXT = 256
USER = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.models import load_model
    from tests.synthetic import write_tiny_model

    path = tmp_path_factory.mktemp("server") / "tiny.gguf"
    write_tiny_model(path, "qwen2", tokenizer=True, tied=False, seed=1)  # untied: varied replies
    return load_model(path)


@pytest.fixture(scope="module")
def service(tiny, tmp_path_factory):
    svc = EngineService(tiny, slots=2, capacity=CONTEXT, sidecar_dir=tmp_path_factory.mktemp("slots"))
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def client(service):
    with TestClient(create_app(service, ["tiny", "tiny.gguf"], limits=Limits(max_body=2**20, max_tokens=CONTEXT))) as c:
        yield c


def chat(client, **fields):
    return client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, "max_tokens": 8} | fields)


def sse(client, path, body) -> list:
    """The data payloads of a streamed reply ("[DONE]" kept as is)."""
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    return [line if line == "[DONE]" else json.loads(line) for line in lines]


def test_models_lists_the_served_model(client):
    body = client.get("/v1/models").json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["tiny"]


def test_a_chat_completion_has_openais_shape_and_usage(client):
    body = chat(client, seed=3).json()
    assert body["object"] == "chat.completion" and body["model"] == "tiny"
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] and usage["completion_tokens"] <= 8
    assert "cached_tokens" in usage["prompt_tokens_details"]
    assert body["fucina"]["speculation"] is not None  # speculation is on by default


def test_a_stream_carries_the_same_reply_as_a_whole_one(client):
    whole = chat(client, seed=11, temperature=1.0)
    chunks = sse(client, "/v1/chat/completions", {"model": "tiny", "messages": USER, "max_tokens": 8, "seed": 11,
                                                  "temperature": 1.0, "stream": True,
                                                  "stream_options": {"include_usage": True}})
    assert chunks[-1] == "[DONE]"
    *events, usage_chunk, _ = chunks
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert text == whole.json()["choices"][0]["message"]["content"]
    assert events[-1]["choices"][0]["finish_reason"] == whole.json()["choices"][0]["finish_reason"]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == whole.json()["usage"]["completion_tokens"]


def test_a_seed_reproduces_and_another_seed_differs(client):
    replies = [chat(client, seed=s, temperature=1.0, max_tokens=16).json()["choices"][0]["message"]["content"]
               for s in (5, 5, 6)]
    assert replies[0] == replies[1] != replies[2]


def test_a_stop_sequence_ends_the_reply(client):
    full = chat(client, seed=9, temperature=1.0, max_tokens=30).json()["choices"][0]["message"]["content"]
    at = next(i for i in range(3, len(full) - 1)
              if full[i:i + 2].isascii() and full[i:i + 2].isprintable() and full.find(full[i:i + 2]) == i)
    cut = chat(client, seed=9, temperature=1.0, max_tokens=30, stop=[full[at:at + 2]]).json()
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert full.startswith(cut["choices"][0]["message"]["content"]) and len(cut["choices"][0]["message"]["content"]) <= at + 1


def test_a_json_schema_reply_validates(client):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
    body = chat(client, seed=2, temperature=1.0, max_tokens=40,
                response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}).json()
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), schema)


def test_a_json_schema_reply_at_its_limit_is_a_whole_document_flagged_as_closed(client):
    schema = {"type": "object", "properties": {"words": {"type": "array", "items": {"type": "string"},
                                                          "minItems": 3}}, "required": ["words"]}
    body = chat(client, seed=4, temperature=1.5, max_tokens=24,
                response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}).json()
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), schema)
    assert body["usage"]["completion_tokens"] <= 24
    # a random model's words run on: closed, OpenAI's finish reason with the flag beside it
    assert body["fucina"]["closed_at_length_limit"] and body["choices"][0]["finish_reason"] == "length"
    too_short = chat(client, max_tokens=2,
                     response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}})
    assert too_short.status_code == 400 and "the shortest reply" in too_short.json()["error"]["message"]


def test_a_resent_conversation_is_cached(client):
    first = chat(client, messages=[{"role": "user", "content": "a long question about things"}], seed=1).json()
    resent = chat(client, seed=1, messages=[
        {"role": "user", "content": "a long question about things"},
        {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
        {"role": "user", "content": "go on"}]).json()
    assert resent["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"] - 1


def test_completions_continue_a_prompt(client):
    body = client.post("/v1/completions", json={"model": "tiny", "prompt": "Once upon", "max_tokens": 6, "seed": 4}).json()
    assert body["object"] == "text_completion" and isinstance(body["choices"][0]["text"], str)
    chunks = sse(client, "/v1/completions", {"model": "tiny", "prompt": "Once upon", "max_tokens": 6, "seed": 4,
                                             "stream": True})
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == body["choices"][0]["text"]


def test_embeddings_as_floats_and_as_base64(client):
    import base64

    import numpy as np

    as_floats = client.post("/v1/embeddings", json={"model": "tiny", "input": ["one text", "another text"]}).json()
    assert as_floats["object"] == "list" and [d["index"] for d in as_floats["data"]] == [0, 1]
    vectors = np.array([d["embedding"] for d in as_floats["data"]], dtype=np.float32)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, rtol=1e-5)
    packed = client.post("/v1/embeddings", json={"model": "tiny", "input": "one text", "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(packed.json()["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, vectors[0])
    assert as_floats["usage"]["prompt_tokens"] > packed.json()["usage"]["prompt_tokens"] > 0


NESTED = b"[" * 100_000 + b"]" * 100_000


def body_of(**fields) -> bytes:
    return json.dumps({"model": "tiny", "messages": USER} | fields).encode()


BAD_REQUESTS = {  # name: (method, path, raw body, expected status)
    "malformed JSON": ("POST", "/v1/chat/completions", b'{"model": "tiny", ', 400),
    "not an object": ("POST", "/v1/chat/completions", b"[1, 2]", 400),
    "nested past the parser": ("POST", "/v1/chat/completions", NESTED, 400),
    "not UTF-8": ("POST", "/v1/chat/completions", b'{"model": "\xff"}', 400),
    "50 MB body": ("POST", "/v1/chat/completions", b" " * (50 * 2**20), 413),
    "max_tokens 10**9": ("POST", "/v1/chat/completions", body_of(max_tokens=10**9), 400),
    "max_tokens a string": ("POST", "/v1/chat/completions", body_of(max_tokens="8"), 400),
    "max_tokens a boolean": ("POST", "/v1/chat/completions", body_of(max_tokens=True), 400),
    "unknown model": ("POST", "/v1/chat/completions", body_of(model="gpt-4o"), 404),
    "no model": ("POST", "/v1/chat/completions", json.dumps({"messages": USER}).encode(), 400),
    "no messages": ("POST", "/v1/chat/completions", json.dumps({"model": "tiny"}).encode(), 400),
    "messages a string": ("POST", "/v1/chat/completions", body_of(messages="hi"), 400),
    "unknown role": ("POST", "/v1/chat/completions", body_of(messages=[{"role": "wizard", "content": "x"}]), 400),
    "content a number": ("POST", "/v1/chat/completions", body_of(messages=[{"role": "user", "content": 3}]), 400),
    "trailing assistant message": ("POST", "/v1/chat/completions",
                                   body_of(messages=USER + [{"role": "assistant", "content": "x"}]), 400),
    "a lone surrogate": ("POST", "/v1/chat/completions", body_of(messages=[{"role": "user", "content": "\ud800"}]), 400),
    "a lone surrogate in stop": ("POST", "/v1/chat/completions", body_of(stop=["\udfff"]), 400),
    "temperature a string": ("POST", "/v1/chat/completions", body_of(temperature="hot"), 400),
    "temperature NaN": ("POST", "/v1/chat/completions", body_of()[:-1] + b', "temperature": NaN}', 400),
    "top_p above 1": ("POST", "/v1/chat/completions", body_of(top_p=3), 400),
    "negative seed": ("POST", "/v1/chat/completions", body_of(seed=-1), 400),
    "n=2": ("POST", "/v1/chat/completions", body_of(n=2), 400),
    "five stop sequences": ("POST", "/v1/chat/completions", body_of(stop=list("abcde")), 400),
    "an empty stop sequence": ("POST", "/v1/chat/completions", body_of(stop=""), 400),
    "stream a string": ("POST", "/v1/chat/completions", body_of(stream="yes"), 400),
    "unknown response format": ("POST", "/v1/chat/completions", body_of(response_format={"type": "xml"}), 400),
    "schema not an object": ("POST", "/v1/chat/completions",
                             body_of(response_format={"type": "json_schema", "json_schema": {"schema": "x"}}), 400),
    "prompt beyond the context": ("POST", "/v1/completions",
                                  json.dumps({"model": "tiny", "prompt": "word " * CONTEXT}).encode(), 400),
    "completion without a prompt": ("POST", "/v1/completions", json.dumps({"model": "tiny"}).encode(), 400),
    "embeddings without input": ("POST", "/v1/embeddings", json.dumps({"model": "tiny"}).encode(), 400),
    "65 texts to embed": ("POST", "/v1/embeddings", json.dumps({"model": "tiny", "input": ["a"] * 65}).encode(), 400),
    "a text beyond the context to embed": ("POST", "/v1/embeddings",
                                           json.dumps({"model": "tiny", "input": "word " * CONTEXT}).encode(), 400),
    "embeddings of an unknown model": ("POST", "/v1/embeddings", json.dumps({"model": "x", "input": "a"}).encode(), 404),
    "unknown route": ("GET", "/v1/engines", b"", 404),
    "wrong method": ("GET", "/v1/chat/completions", b"", 405),
}


@pytest.mark.parametrize("name", BAD_REQUESTS)
def test_a_bad_request_gets_an_openai_error_and_the_server_goes_on(client, name):
    method, path, body, status = BAD_REQUESTS[name]
    r = client.request(method, path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert isinstance(error["message"], str) and error["message"] and "Traceback" not in error["message"]
    assert {"type", "param", "code"} <= error.keys()
    assert chat(client, max_tokens=2).status_code == 200


def test_a_chunked_body_past_the_bound_is_refused(client):
    def chunks():
        for _ in range(3):
            yield b" " * 2**20
    r = client.post("/v1/chat/completions", content=chunks())  # no Content-Length: counted while read
    assert r.status_code == 413


def test_no_cors_headers_are_sent(client):
    origin = {"origin": "https://example.com", "access-control-request-method": "POST"}
    preflight = client.options("/v1/chat/completions", headers=origin)
    assert preflight.status_code == 405
    reply = chat(client)
    assert not any(k.lower().startswith("access-control-") for k in preflight.headers | reply.headers)


def test_an_api_key_is_required_when_set(service):
    with TestClient(create_app(service, ["tiny"], api_key="s3cret")) as c:
        missing = c.get("/v1/models")
        wrong = c.get("/v1/models", headers={"authorization": "Bearer s3cres"})
        right = c.get("/v1/models", headers={"authorization": "Bearer s3cret"})
    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["error"]["code"] == "missing_api_key" and wrong.json()["error"]["code"] == "invalid_api_key"
    assert right.status_code == 200


def test_the_api_key_is_compared_in_constant_time(service, monkeypatch):
    import app.server as server

    compared = []
    monkeypatch.setattr(server.hmac, "compare_digest", lambda a, b: compared.append((a, b)) or a == b)
    with TestClient(create_app(service, ["tiny"], api_key="k")) as c:
        assert c.get("/v1/models", headers={"authorization": "Bearer x"}).status_code == 401
    assert compared == [(b"x", b"k")]


def test_a_busy_service_answers_503_and_serves_again_afterwards(client, service, monkeypatch):
    from engine.serving.service import ServiceBusy

    def busy(request, sink=None):
        raise ServiceBusy("all 2 slots are busy and 64 requests wait already; try again shortly")

    monkeypatch.setattr(service, "submit", busy)
    r = chat(client)
    assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
    monkeypatch.undo()
    assert chat(client).status_code == 200
