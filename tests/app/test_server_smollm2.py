"""The official openai client against the server on the real default model (in-process): a json_schema
reply that validates, a seed that reproduces, a stop sequence that ends the reply, and a conversation
resent after a restart that is warm."""

import json

import jsonschema
import openai
from starlette.testclient import TestClient

from app.server import create_app
from engine.serving.service import EngineService

NAME = "smollm2-135m-instruct"
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"}}}


def serve(model, sidecars):
    service = EngineService(model, slots=2, capacity=1024, sidecar_dir=sidecars)
    http = TestClient(create_app(service, [NAME]))
    return service, http, openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http,
                                        max_retries=0)


def test_the_openai_client_on_smollm2(model_path, tmp_path):
    from engine.models import load_model

    model = load_model(model_path(NAME))
    question = [{"role": "user", "content": "Invent a person. Reply with their name and age as JSON."}]
    service, http, client = serve(model, tmp_path)
    try:
        person = client.chat.completions.create(
            model=NAME, messages=question, max_tokens=80, seed=1,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
        jsonschema.validate(json.loads(person.choices[0].message.content), PERSON)

        story = [{"role": "user", "content": "Write one sentence about a lighthouse."}]
        a, b = (client.chat.completions.create(model=NAME, messages=story, max_tokens=16, seed=42, temperature=0.9)
                for _ in range(2))
        assert a.choices[0].message.content == b.choices[0].message.content
        assert b.usage.prompt_tokens_details.cached_tokens == b.usage.prompt_tokens - 1  # all but the last token

        full = a.choices[0].message.content  # the same reply cut where a later part of it first appears
        at = next(i for i in range(3, len(full) - 1) if full[i:i + 2].isascii() and full[i:i + 2].strip()
                  and full.find(full[i:i + 2]) == i)
        cut = client.chat.completions.create(model=NAME, messages=story, max_tokens=16, seed=42, temperature=0.9,
                                             stop=[full[at:at + 2]])
        assert cut.choices[0].finish_reason == "stop"
        assert full.startswith(cut.choices[0].message.content) and len(cut.choices[0].message.content) <= at + 1
    finally:
        http.close()
        service.close()

    service, http, client = serve(model, tmp_path)  # a restart: the slots come back from their sidecars
    try:
        resent = story + [{"role": "assistant", "content": a.choices[0].message.content},
                          {"role": "user", "content": "And another."}]
        again = client.chat.completions.create(model=NAME, messages=resent, max_tokens=8, seed=42)
        assert again.usage.prompt_tokens_details.cached_tokens >= a.usage.prompt_tokens - 1
    finally:
        http.close()
        service.close()
