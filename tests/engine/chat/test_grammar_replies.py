"""Grammar-constrained replies on the real starter models: the JSON-schema suite (tests/data/grammar),
regex and Lark cases, greedy and seeded, every reply parsing and validating and ending on the template's
stop token. All cases of one model and sampling mode decode together in one lockstep batch (send_batch,
one processor per stream) to keep the CI cost to a few short batched decodes."""

import dataclasses
import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from engine.chat import ChatOptions, Conversation, send_batch, template_for_model
from engine.sampling import CHAT_DEFAULTS, SamplerConfig
from engine.sampling.grammar import Grammar
from engine.tokenize.vocab import CONTROL

SCHEMAS = json.loads((Path(__file__).parents[2] / "data" / "grammar" / "json_schemas.json").read_text())
MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]
MAX_TOKENS = 80  # above the longest valid reply the suite allows; a cut reply fails as "length"

REGEXES = [
    ("What is 7 times 6? Answer with the number only.", r"[0-9]{1,3}"),
    ("Name a weekday.", r"(Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day"),
    ("Give a hex colour.", r"#[0-9a-f]{6}"),
    ("Answer yes or no: is the sun hot?", r"(yes|no)"),
]
LARKS = [  # (prompt, grammar, the regex its language is)
    ("Write a small sum.", 'start: num (" + " num){1,3} " = " num\nnum: /[0-9]{1,2}/',
     r"[0-9]{1,2}( \+ [0-9]{1,2}){1,3} = [0-9]{1,2}"),
    ("List two animals.", 'start: "- " animal "\\n- " animal\nanimal: "cat" | "dog" | "owl" | "fox"',
     r"- (cat|dog|owl|fox)\n- (cat|dog|owl|fox)"),
]
# A value that spells the template's stop marker: the text must come from ordinary tokens, never the marker.
CONTROL_SPELLING = {"type": "object", "properties": {"marker": {"enum": ["<|im_end|>", "<|endoftext|>"]}},
                    "required": ["marker"], "additionalProperties": False}


def cases():
    """(prompt, grammar, check): check(text) raises when the reply is wrong."""
    def schema_check(schema):
        return lambda text: jsonschema.validate(json.loads(text), schema)

    def regex_check(pattern):
        def check(text):
            assert re.fullmatch(pattern, text), f"does not match {pattern!r}"
        return check

    out = [(c["prompt"], Grammar("json_schema", json.dumps(c["schema"])), schema_check(c["schema"])) for c in SCHEMAS]
    out += [(p, Grammar("regex", r), regex_check(r)) for p, r in REGEXES]
    out += [(p, Grammar("lark", g), regex_check(r)) for p, g, r in LARKS]
    out.append(("End your turn with the special end marker.", Grammar("json_schema", json.dumps(CONTROL_SPELLING)),
                schema_check(CONTROL_SPELLING)))
    return out


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
@pytest.mark.parametrize("name", MODELS)
def test_every_constrained_reply_parses_validates_and_ends_on_the_stop_token(real_model, name, sampling):
    model, tokenizer = real_model(name)
    template = template_for_model(model.file.metadata, tokenizer)
    all_cases = cases()
    convos = []
    for i, (_, grammar, _) in enumerate(all_cases):
        sampler = SamplerConfig() if sampling == "greedy" else dataclasses.replace(CHAT_DEFAULTS, seed=1000 + i)
        options = ChatOptions(capacity=192, max_tokens=MAX_TOKENS, sampler=sampler, grammar=grammar)
        convos.append(Conversation(model, tokenizer, template, options))
    results = send_batch(convos, [prompt for prompt, _, _ in all_cases])

    control_ids = set(np.flatnonzero(tokenizer.vocab.types == CONTROL).tolist())
    failures = []
    for (prompt, grammar, check), result in zip(all_cases, results):
        try:
            assert result.finish_reason == "stop", f"finish_reason {result.finish_reason}"
            check(result.text)
            assert not control_ids & set(result.token_ids), "a control token inside the reply"
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            failures.append(f"{prompt!r} -> {result.text!r}: {str(e).splitlines()[0]}")
    assert not failures, "\n".join(failures)
    marker = json.loads(results[-1].text)["marker"]  # spelled in ordinary tokens
    assert marker in ("<|im_end|>", "<|endoftext|>") and tokenizer.token_id(marker) not in results[-1].token_ids
