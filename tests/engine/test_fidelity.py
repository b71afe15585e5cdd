"""Parity with llama.cpp on the starter models, through `fucina eval` (golden/README.md's bars)."""

import json
import os

import numpy as np
import pytest

from app.cli import main as fucina

from tests.golden import GOLDEN, GOLDEN_STEM as MODELS

CASES = [(m, g + suffix) for m, g in MODELS.items() for suffix in ("", ".long")]
# the CPU unless a hardware check names another backend (benchmarks/cuda_check.sh)
BACKEND = os.environ.get("FUCINA_TEST_BACKEND", "cpu")


def golden_positions(golden_file: str):
    data = json.loads((GOLDEN / f"{golden_file}.json").read_text())
    tf = data.get("teacher_forced", data)
    k = "top10" if "top10_ids" in tf else "top5"
    return tf["ids"], tf[f"{k}_ids"], tf[f"{k}_logits"]


def fidelity(model_file, ids, ref_ids, ref_logits, kv, capsys, path="prefill"):
    """(agreement at margin > 0.5, agreement at margin > 1.0, mean |Δlogit| over the reference top-k)."""
    k = len(ref_ids[0])
    assert fucina(["eval", str(model_file), "--ids", ",".join(map(str, ids)), "--top", "64",
                   "--kv", kv, "--path", path, "--backend", BACKEND, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["positions"]
    assert len(rows) == len(ids)
    agree = {0.5: [], 1.0: []}
    diffs = []
    for row, rid, rl in zip(rows, ref_ids, ref_logits):
        ours = dict(zip(row["top_ids"], row["top_logits"]))
        for margin in agree:
            if rl[0] - rl[1] > margin:
                agree[margin].append(row["top_ids"][0] == rid[0])
        # every reference top-k id is inside our top-64 at these margins; a miss counts as a big error
        diffs.append(np.mean([abs(ours[i] - l) if i in ours else 10.0 for i, l in zip(rid[:k], rl[:k])]))
    return np.mean(agree[0.5]), np.mean(agree[1.0]), float(np.mean(diffs))


# "rows" is the decode numerics (bitwise one token at a time, tests/engine/test_row_wise.py) at the cost of
# one weight pass per 64 positions
@pytest.mark.parametrize("path", ["prefill", "rows"])
@pytest.mark.parametrize("model,golden", CASES)
def test_f16_cache_meets_the_bars(model, golden, path, model_path, capsys):
    ids, ref_ids, ref_logits = golden_positions(golden)
    a05, _, diff = fidelity(model_path(model), ids, ref_ids, ref_logits, "f16", capsys, path)
    print(f"\n{golden} f16 {path}: agreement@0.5 {a05:.4f}, mean|dlogit| {diff:.4f}")
    assert a05 == 1.0
    assert diff <= 0.25


@pytest.mark.parametrize("model,golden", CASES)
def test_q8_0_cache_agrees_at_margin_one(model, golden, model_path, capsys):
    ids, ref_ids, ref_logits = golden_positions(golden)
    a05, a10, diff = fidelity(model_path(model), ids, ref_ids, ref_logits, "q8_0", capsys)
    print(f"\n{golden} q8_0: agreement@0.5 {a05:.4f}, @1.0 {a10:.4f}, mean|dlogit| {diff:.4f}")
    assert a10 == 1.0


@pytest.mark.parametrize("model", MODELS)
def test_greedy_generation_follows_llama_cpp(model, model_path, capsys):
    """`fucina generate` on the golden chat prompts: the first token must match wherever llama.cpp's
    margin is clear; how far the continuations agree is reported (near-ties may part them)."""
    cases = json.loads((GOLDEN / f"{MODELS[model]}.json").read_text())["greedy"]
    report = []
    for case in cases:
        ref = case["greedy_ids"]
        assert fucina(["generate", str(model_path(model)), "--prompt-ids", ",".join(map(str, case["prompt_ids"])),
                       "--max-tokens", str(len(ref)), "--no-stop", "--json"]) == 0
        ours = json.loads(capsys.readouterr().out)["ids"]
        first = case["first_steps"][0]
        logits = first["top10_logits"]
        if logits[0] - logits[1] > 0.5:
            assert ours[0] == ref[0]
        same = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), len(ref))
        report.append(f"{model}: {same}/{len(ref)} greedy tokens identical to llama.cpp for {case['user']!r}")
    print("\n" + "\n".join(report))
