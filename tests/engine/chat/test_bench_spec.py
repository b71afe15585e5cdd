"""The speculative benchmark: workload files, the pasted previous reply, identical plain and speculative
replies on a tiny model, and a loud failure when they differ."""

import json

import pytest

from app.cli.bench import WORKLOADS
from engine.benchmarks.speculation import Workload, load_workload, run_workload
from engine.chat import speculation
from engine.errors import BenchWorkloadError, SpeculationMismatch
from engine.speculative import stream


@pytest.fixture(autouse=True)
def free_verify(monkeypatch):
    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: 1.0 for m in range(1, 18)})


@pytest.mark.parametrize("content, field", [
    ("not json", "not JSON"), ("[1]", "JSON object"), ('{"turns": []}', "turns"),
    ('{"turns": ["{previous}"]}', "first turn"), ('{"turns": ["hi"], "max_tokens": 0}', "max_tokens"),
    ('{"turns": ["hi"], "edits": [["a"]]}', "edits"), ('{"turns": ["hi"], "system": 3}', "system")])
def test_a_bad_workload_file_names_the_file_and_the_field(tmp_path, content, field):
    path = tmp_path / "w.json"
    path.write_text(content)
    with pytest.raises(BenchWorkloadError, match=field) as e:
        load_workload(path)
    assert str(path) in str(e.value)
    with pytest.raises(BenchWorkloadError, match="cannot read"):
        load_workload(tmp_path / "missing.json")


def test_the_previous_reply_is_pasted_back_with_each_edit_once():
    w = Workload("w", ("first", "fix this: {previous}"), edits=(("the", "teh"), (".", " .")))
    assert w.user_message(0, "ignored") == "first"
    assert w.user_message(1, "the cat and the dog.") == "fix this: teh cat and the dog ."


def test_the_five_builtin_workloads_load():
    loaded = {p.stem: load_workload(p) for p in WORKLOADS.glob("*.json")}
    assert set(loaded) == {"code_edit", "grounded_answer", "rewrite_json", "free_chat", "multi_turn"}
    assert all(w.name == name for name, w in loaded.items())
    assert "{previous}" in loaded["multi_turn"].turns[1] and loaded["multi_turn"].edits
    assert "def parse_record" in loaded["code_edit"].turns[0]
    json.loads(loaded["rewrite_json"].turns[0].split("\n\n", 1)[1])  # the document to reformat is valid JSON


WORKLOAD = Workload("echo", ("say abc abc abc abc", "again: {previous}"), max_tokens=24, edits=(("a", "b"),))


def test_plain_and_speculative_replies_are_timed_side_by_side(tiny_chat):
    model, tok = tiny_chat
    r = run_workload(model, WORKLOAD, 2, tokenizer=tok)
    assert r["identical"] and r["runs"] == 2 and len(r["per_run"]) == 2
    assert r["reply_tokens"] == 2 * 24  # both turns ran to their budget on this model
    assert r["plain_tps"]["median"] > 0 and r["spec_tps"]["median"] > 0
    assert all(run["spec_stats"]["committed"] == 2 * 24 for run in r["per_run"])


def test_a_differing_speculative_reply_fails_loudly(tiny_chat, monkeypatch):
    model, tok = tiny_chat
    honest = speculation._TurnSampler.sample
    monkeypatch.setattr(speculation._TurnSampler, "sample",
                        lambda self, logits, history: (honest(self, logits, history) + 1) % 200)
    with pytest.raises(SpeculationMismatch, match="turn 1: the speculative reply differs from the plain one at "
                                                  "token 0"):
        run_workload(model, WORKLOAD, 1, tokenizer=tok)
