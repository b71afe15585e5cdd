"""Budget-aware closing: a constrained reply with a token limit always ends as a valid document.

The closer is checked on its own (from states inside strings, numbers, keys, formats and patterns, for JSON
schemas, regexes and Lark), then on a tiny random model, whose replies wander until the limit stops them:
for every limit from the grammar's shortest document up, greedy and sampled, each reply is whole and valid
and takes at most the limit; below it the limit is refused before any token. Speculative decoding closes
exactly as the plain decode does (bitwise equal token streams)."""

import dataclasses
import json
import re

import jsonschema
import numpy as np
import pytest

from engine.chat import ChatOptions, Conversation, Format, Template
from engine.errors import ReplyBudgetTooSmall
from engine.sampling import CHAT_DEFAULTS, Sampler, SamplerConfig
from engine.sampling.closing import Closer
from engine.sampling.grammar import Grammar, grammar_processor
from engine.sampling.processor import LogitProcessor

CHATML = Template(Format.CHATML)

RECIPE = {"type": "object", "properties": {
    "title": {"type": "string"}, "servings": {"type": "integer", "minimum": 1},
    "ingredients": {"type": "array", "items": {"type": "object", "properties": {
        "item": {"type": "string"}, "grams": {"type": "number"}}, "required": ["item", "grams"]}},
    "steps": {"type": "array", "items": {"type": "string", "minLength": 2}, "minItems": 1}},
    "required": ["title", "servings", "ingredients", "steps"]}
CONTACT = {"type": "object", "properties": {
    "name": {"type": "string", "pattern": "^[A-Z][a-z]+$"}, "email": {"type": "string", "format": "email"},
    "when": {"type": "string", "format": "date-time"}, "note": {"type": "string", "maxLength": 5},
    "kind": {"enum": ["personal", "work", "x"]}}, "required": ["name", "email", "when", "kind"],
    "additionalProperties": False}


def closes(grammar: Grammar, prefix: bytes) -> bytes:
    closer = Closer(grammar.compiled)
    assert closer.feed(prefix)
    closing = closer.closing()
    assert closing is not None
    whole = Closer(grammar.compiled)
    assert whole.feed(prefix + closing) and whole.done
    return closing


@pytest.mark.parametrize("prefix", [
    b"", b'{"title": "Pan', b'{"title": "P", "servings": 1', b'{"title": "P", "servings": 12, "ingredients": [{"it',
    b'{"title": "P", "servings": 1, "ingredients": [], "steps": ["a', b'{"title": "P\\',
])
def test_a_recipe_closes_from_anywhere_inside_it(prefix):
    closing = closes(Grammar("json_schema", json.dumps(RECIPE)), prefix)
    jsonschema.validate(json.loads(prefix + closing), RECIPE)


@pytest.mark.parametrize("prefix", [
    b'{"name": "Jo', b'{"name": "Al", "email": "al', b'{"name": "Al", "email": "a@b.co", "when": "2024-0'])
def test_patterns_formats_and_enums_close_with_values_they_accept(prefix):
    closing = closes(Grammar("json_schema", json.dumps(CONTACT)), prefix)
    value = json.loads(prefix + closing)
    jsonschema.validate(value, CONTACT, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def test_the_closing_skips_optional_keys_and_takes_the_shortest_values():
    closing = closes(Grammar("json_schema", json.dumps(CONTACT)), b'{"name": "Al", "email": "a@b.co", ')
    assert b"note" not in closing and closing.endswith(b'"kind": "x"}')


def test_regex_and_lark_grammars_close_too():
    assert closes(Grammar("regex", r"[A-Z]{3}-[0-9]{2}( ok)?"), b"AB") == b"A-11"
    lark = 'start: "(" item (", " item)* ")"\nitem: /[a-z]+/ | start'
    closing = closes(Grammar("lark", lark), b"((ab, (c")
    assert closing == b")))"


# -- on a tiny random model ---------------------------------------------------------------------------

def reply(tiny_chat, grammar, max_tokens, sampler=None, speculation=False):
    model, tok = tiny_chat
    options = ChatOptions(capacity=512, max_tokens=max_tokens, sampler=sampler or SamplerConfig(),
                          grammar=grammar, speculation=speculation)
    c = Conversation(model, tok, CHATML, options)
    "".join(c.send("write it"))
    return c.last_turn


def minimal_tokens(tiny_chat, grammar):
    processor = grammar_processor(grammar, tiny_chat[1])
    processor.set_budget(10_000)
    return processor.budget.minimal


@pytest.mark.parametrize("schema", [RECIPE, CONTACT], ids=["recipe", "contact"])
def test_every_limit_from_the_shortest_document_up_gives_a_whole_valid_reply(tiny_chat, schema):
    grammar = Grammar("json_schema", json.dumps(schema))
    shortest = minimal_tokens(tiny_chat, grammar)
    closed = 0
    for max_tokens in range(shortest, shortest + 24, 3):
        for seed in (None, 1, 2):
            sampler = SamplerConfig() if seed is None else dataclasses.replace(CHAT_DEFAULTS, temperature=1.5,
                                                                               seed=seed)
            turn = reply(tiny_chat, grammar, max_tokens, sampler)
            assert len(turn.token_ids) <= max_tokens
            jsonschema.validate(json.loads(turn.text), schema,
                                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
            assert turn.finish_reason in ("stop", "length_closed")
            closed += turn.finish_reason == "length_closed"
    assert closed  # a random model's replies run into their limits: the closing was exercised


def test_a_limit_below_the_shortest_document_is_refused_before_any_token(tiny_chat):
    grammar = Grammar("json_schema", json.dumps(RECIPE))
    shortest = minimal_tokens(tiny_chat, grammar)
    model, tok = tiny_chat
    c = Conversation(model, tok, CHATML, ChatOptions(capacity=512, max_tokens=shortest - 1, grammar=grammar))
    with pytest.raises(ReplyBudgetTooSmall, match=f"takes {shortest} tokens"):
        "".join(c.send("write it"))
    assert c.cache.len == 0 and c.history == []


def test_a_regex_reply_closes_within_its_limit(tiny_chat):
    grammar = Grammar("regex", r"(ab|cd)+-[0-9]{3}")
    for max_tokens in range(6, 30, 4):
        turn = reply(tiny_chat, grammar, max_tokens, dataclasses.replace(CHAT_DEFAULTS, temperature=1.5, seed=3))
        assert re.fullmatch(r"(ab|cd)+-[0-9]{3}", turn.text) and len(turn.token_ids) <= max_tokens


@pytest.mark.parametrize("seed", [None, 7])
def test_speculation_closes_exactly_as_the_plain_decode(tiny_chat, seed):
    grammar = Grammar("json_schema", json.dumps(RECIPE))
    sampler = SamplerConfig() if seed is None else dataclasses.replace(CHAT_DEFAULTS, temperature=1.5, seed=seed)
    budget = minimal_tokens(tiny_chat, grammar) + 12
    plain = reply(tiny_chat, grammar, budget, sampler)
    fast = reply(tiny_chat, grammar, budget, sampler, speculation=True)
    again = reply(tiny_chat, grammar, budget, sampler)  # nothing learnt from earlier replies changes a reply
    assert plain.finish_reason == fast.finish_reason == "length_closed"
    np.testing.assert_array_equal(fast.token_ids, plain.token_ids)
    np.testing.assert_array_equal(again.token_ids, plain.token_ids)


# -- the sampler's vetting seam -----------------------------------------------------------------------

class RefuseBelow(LogitProcessor):
    """Refuses every pick below `floor`."""

    def __init__(self, floor):
        self.floor, self.committed = floor, []

    def process(self, logits, history):
        pass

    def vet(self, token):
        return token if token >= self.floor else None

    def commit(self, token):
        self.committed.append(token)


def test_a_refused_pick_is_replaced_by_the_next_choice_of_the_same_draw():
    logits = np.array([5.0, 4.0, 3.0, 2.0, 1.0], dtype=np.float32)
    assert Sampler(SamplerConfig(), RefuseBelow(2)).sample(logits) == 2  # greedy: the next argmax
    config = dataclasses.replace(CHAT_DEFAULTS, seed=11)
    vetted, free = Sampler(config, RefuseBelow(1)), Sampler(config)
    for _ in range(20):  # one draw per token either way: the streams stay in step
        a, b = vetted.sample(logits), free.sample(logits)
        assert a >= 1 and (a == b or b == 0)


def test_the_repeat_penalty_applies_inside_a_constrained_span(tiny_chat):
    tok = tiny_chat[1]
    a, b = tok.encode_plain("a")[0], tok.encode_plain("b")[0]
    logits = np.zeros(tok.vocab_size, dtype=np.float32)
    logits[a], logits[b] = 2.0, 1.5
    for penalty, expected in ((1.0, a), (2.0, b)):
        processor = grammar_processor(Grammar("regex", "[ab]+"), tok)
        sampler = Sampler(SamplerConfig(repeat_penalty=penalty), processor)
        assert sampler.sample(logits, history=[a] * 8) == expected  # "a" again and again is penalized
