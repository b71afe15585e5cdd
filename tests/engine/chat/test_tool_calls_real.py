"""Tool calls on the real starter models: the suite of tool definitions (tests/data/tools/tool_suite.json:
nested objects, enums, arrays, patterns, formats, required fields), greedy and seeded. Every reply must call,
and every call must parse and validate against its tool's schema. Qwen2.5 renders the tools through its own
template; SmolLM2's template has no tools, so they are described in its system prompt (Hermes).

Greedy: each case offers its own tool and names it (tool_choice NAME). Seeded: every second case offers its
tool and its two neighbours with tool_choice `required`, so the model also picks the tool (between them, the
offers cover every tool). Both models, both modes. All cases of one model and mode decode together in one
lockstep batch."""

import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest

from engine.chat import ChatOptions, Conversation, send_batch, template_for_model
from engine.chat.tool_use import ToolUse, specs_from_openai
from engine.sampling import CHAT_DEFAULTS, SamplerConfig

SUITE = json.loads((Path(__file__).parents[2] / "data" / "tools" / "tool_suite.json").read_text())
SPECS = specs_from_openai([case["tool"] for case in SUITE])
MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]


def test_the_suite_is_large_and_varied():
    assert len(SPECS) >= 20
    kinds = json.dumps([s.parameters for s in SPECS])
    for keyword in ('"enum"', '"items"', '"required"', '"pattern"', '"format"', '"additionalProperties"'):
        assert keyword in kinds


def offered(i: int, sampling: str) -> ToolUse:
    if sampling == "greedy":
        return ToolUse((SPECS[i],), SPECS[i].name)
    return ToolUse(tuple(SPECS[j % len(SPECS)] for j in (i, i + 1, i + 2)), "required")


def validator(schema: dict):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def cases(sampling: str) -> range:
    return range(len(SUITE)) if sampling == "greedy" else range(0, len(SUITE), 2)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_every_call_parses_and_validates_against_its_schema(real_model, name, sampling):
    model, tokenizer = real_model(name)
    template = template_for_model(model.file.metadata, tokenizer)
    convos = []
    for i in cases(sampling):
        sampler = SamplerConfig() if sampling == "greedy" else dataclasses.replace(CHAT_DEFAULTS, seed=2000 + i)
        options = ChatOptions(capacity=1024, max_tokens=160, sampler=sampler, tools=offered(i, sampling))
        convos.append(Conversation(model, tokenizer, template, options))
    results = send_batch(convos, [SUITE[i]["prompt"] for i in cases(sampling)])

    schemas = {s.name: s.parameters for s in SPECS}
    failures = []
    for i, result in zip(cases(sampling), results):
        case, use = SUITE[i], offered(i, sampling)
        try:
            # length_closed: a call's arguments were closed to fit the reply's limit, still a whole call
            assert result.finish_reason in ("stop", "length_closed"), f"finish_reason {result.finish_reason}"
            assert result.tool_calls, f"no call in {tokenizer.decode(result.token_ids)!r}"
            for call in result.tool_calls:
                assert call.name in {t.name for t in use.callable}, f"called {call.name}"
                validator(schemas[call.name]).validate(call.arguments)
            if sampling == "greedy":
                assert result.tool_calls[0].name == SPECS[i].name
        except (AssertionError, jsonschema.ValidationError) as e:
            failures.append(f"{case['prompt']!r}: {str(e).splitlines()[0]}")
    assert not failures, "\n".join(failures)


def test_a_reply_without_a_call_is_free_text(real_model):
    """tool_choice auto: the model may answer in words; the tools are in the prompt, the reply unconstrained."""
    model, tokenizer = real_model("qwen2.5-coder-0.5b-instruct")
    options = ChatOptions(capacity=1024, max_tokens=24, tools=ToolUse((SPECS[0],), "auto"))
    convo = Conversation.for_model(model, options, tokenizer=tokenizer)
    "".join(convo.send("Say hello to me in one short sentence."))
    result = convo.last_turn
    assert not result.tool_calls and result.text.strip()
    assert '"name": "get_weather"' in tokenizer.decode(convo.history)  # the tool was rendered in the prompt
