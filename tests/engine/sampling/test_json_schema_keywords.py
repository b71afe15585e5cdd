"""Every JSON Schema keyword has an answer: rewritten and enforced, or named and checked after the reply."""

import json

import pytest

from engine.sampling.closing import Closer
from engine.sampling.grammar import Grammar
from engine.sampling.json_schema import KEYWORDS, check_reply, rewrite


def accepts(grammar: Grammar, text: str) -> bool:
    closer = Closer(grammar.compiled)
    return closer.feed(text.encode()) and closer.done


def test_a_schema_with_keywords_llguidance_cannot_enforce_compiles_and_names_them():
    schema = {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "ids": {"type": "array", "contains": {"const": 1}},
        "phone": {"type": "string", "format": "phone"}},
        "if": {"required": ["tags"]}, "then": {"required": ["ids"]}, "not": {"required": ["x"]},
        "propertyNames": {"maxLength": 8}}
    grammar = Grammar("json_schema", json.dumps(schema))
    assert grammar.unenforced == ("contains", "format: phone", "if", "not", "propertyNames", "then",
                                  "uniqueItems")


def test_unique_items_over_a_small_enum_is_enforced_while_writing():
    schema = {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "uniqueItems": True, "minItems": 1}
    grammar = Grammar("json_schema", json.dumps(schema))
    assert "uniqueItems" not in grammar.unenforced
    assert accepts(grammar, '["red", "blue"]') and accepts(grammar, '["green"]')
    assert not accepts(grammar, '["red", "red"]') and not accepts(grammar, "[]")


def test_dependent_required_is_enforced_while_writing():
    schema = {"type": "object", "properties": {"card": {"type": "string"}, "cvv": {"type": "string"}},
              "dependentRequired": {"card": ["cvv"]}}
    grammar = Grammar("json_schema", json.dumps(schema))
    assert grammar.unenforced == ()
    assert accepts(grammar, '{"card": "1", "cvv": "2"}') and accepts(grammar, '{"cvv": "2"}')
    assert not accepts(grammar, '{"card": "1"}')
    assert rewrite(schema) != schema and "dependentRequired" in schema  # the caller's schema is untouched


@pytest.mark.parametrize("text, expected", [
    ('{"tags": ["a", "b"]}', []),
    ('{"tags": ["a", "a"]}', ["uniqueItems"]),
    ('{"tags": ["a"], "n": 3}', ["then"]),
])
def test_a_reply_is_warned_about_exactly_the_unenforced_keywords_it_breaks(text, expected):
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                        "uniqueItems": True}, "n": {"type": "integer"}},
              "if": {"required": ["n"]}, "then": {"properties": {"n": {"maximum": 2}}}}
    grammar = Grammar("json_schema", json.dumps(schema))
    warnings = check_reply(schema, text, grammar.unenforced)
    assert [w.keyword for w in warnings] == expected
    assert all(w.path.startswith("$") for w in warnings)
    assert grammar.check_reply(text) == warnings


def test_a_keyword_enforced_while_writing_is_never_reported():
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 2}}}
    grammar = Grammar("json_schema", json.dumps(schema))
    assert grammar.check_reply('{"a": "too long"}') == []  # llguidance keeps it from being written


def test_the_keyword_table_names_every_keyword_the_suite_uses():
    for keyword in ("uniqueItems", "contains", "if", "then", "else", "not", "dependentRequired",
                    "dependentSchemas", "patternProperties", "propertyNames", "format", "$ref", "multipleOf"):
        assert keyword in KEYWORDS


def test_the_docs_list_every_keyword_as_the_table_says():
    from pathlib import Path
    docs = (Path(__file__).parents[3] / "docs" / "json-schema.md").read_text()
    for keyword, handling in KEYWORDS.items():
        assert f"| `{keyword}` | {handling} |" in docs
