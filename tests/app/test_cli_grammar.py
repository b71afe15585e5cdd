"""The reply-grammar flags of `fucina generate` and `fucina chat`: constrained output, @FILE arguments, a
stored conversation's response format, and the one-line errors for bad grammars."""

import io
import json
import re
import sys

import pytest

from app.cli import main as fucina
from engine.history.store import HistoryStore

MODEL = "smollm2-135m-instruct"


def generate(capsys, *flags):
    assert fucina(["generate", MODEL, "--chat", "--max-tokens", "40", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_follows_a_regex_and_a_schema_file(model_path, capsys, tmp_path):
    model_path(MODEL)
    out = generate(capsys, "--prompt", "What is 7 times 6?", "--regex", "[0-9]{1,3}")
    assert re.fullmatch("[0-9]{1,3}", out["text"])
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
              "additionalProperties": False}
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    out = generate(capsys, "--prompt", "The capital of France?", "--json-schema", f"@{tmp_path / 'schema.json'}")
    assert json.loads(out["text"])["city"] in ("Paris", "Rome")


@pytest.mark.parametrize("flags, message", [
    (["--regex", "a(b"], "error: --regex: invalid regex grammar: "),
    (["--lark", "start: nope"], 'error: --lark: invalid lark grammar: at 1(8): unknown name: "nope"'),
    (["--json-schema", "{oops"], "error: --json-schema: the JSON schema is not valid JSON"),
    (["--gbnf", "@/nonexistent/g.gbnf"], "error: --gbnf: cannot read /nonexistent/g.gbnf"),
    (["--json-object", "--no-stop"], "error: --no-stop cannot be combined with a reply grammar"),
])
def test_a_bad_grammar_is_one_error_line_and_exit_2_before_the_model_loads(capsys, flags, message):
    assert fucina(["generate", "no-such-model", "--prompt", "x", *flags]) == 2  # the model is never looked up
    err = capsys.readouterr().err
    assert err.startswith(message), err


def test_grammar_flags_are_mutually_exclusive(capsys):
    with pytest.raises(SystemExit) as exit_:
        fucina(["chat", MODEL, "--regex", "a", "--json-object"])
    assert exit_.value.code == 2 and "not allowed with" in capsys.readouterr().err


def test_a_stored_chat_keeps_its_response_format(model_path, monkeypatch, capsys, tmp_path):
    model_path(MODEL)
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))

    def chat(*flags):
        monkeypatch.setattr(sys, "stdin", io.StringIO("Is the sun hot? Answer yes or no.\n"))
        assert fucina(["chat", MODEL, "--temp", "0", "--max-tokens", "8", *flags]) == 0
        return capsys.readouterr().out.strip()

    first = chat("--conversation", "new", "--regex", "(YES|NO)!")
    assert first in ("YES!", "NO!")
    store = HistoryStore(HistoryStore.default_path())
    try:
        (conversation,) = store.list_conversations()
    finally:
        store.close()
    assert conversation["sampler"]["response_format"] == {"type": "regex", "grammar": "(YES|NO)!"}
    again = chat("--conversation", conversation["id"])  # reopened: the stored format applies, with no flag
    assert again in ("YES!", "NO!")


def test_a_regex_is_never_read_from_a_file():
    from app.cli import build_parser
    from app.cli.sampling import grammar_from_args
    grammar = grammar_from_args(build_parser().parse_args(["generate", MODEL, "--prompt", "x", "--regex", "@[a-z]+"]))
    assert (grammar.kind, grammar.source) == ("regex", "@[a-z]+")


def test_a_schema_reply_at_its_limit_is_closed_whole_and_its_unenforced_keywords_checked(model_path, capsys,
                                                                                      tmp_path):
    model_path(MODEL)
    schema = {"type": "object", "properties": {  # uniqueItems over strings: checked after, never refused
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 8}},
        "required": ["tags"]}
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    assert fucina(["generate", MODEL, "--chat", "--max-tokens", "24", "--json", "--prompt", "List eight tags.",
                   "--json-schema", f"@{tmp_path / 'schema.json'}"]) == 0
    out = json.loads(capsys.readouterr().out)
    tags = json.loads(out["text"])["tags"]  # whole, though the limit came first
    assert len(out["ids"]) <= 24 and len(tags) >= 8 and out["finish_reason"] == "length_closed"
    repeated = len(set(tags)) < len(tags)
    assert bool(out["schema_warnings"]) == repeated
    assert all("uniqueItems" in w for w in out["schema_warnings"])


def test_a_limit_below_the_shortest_document_is_one_error_line_before_any_token(model_path, capsys):
    model_path(MODEL)
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                         "required": ["a", "b"]})
    assert fucina(["generate", MODEL, "--chat", "--max-tokens", "3", "--prompt", "x", "--json-schema", schema]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: the shortest reply this grammar allows takes ") and not captured.out
