"""The command line's streamed experts: --moe-cache-mb streams a model's experts (the same reply as mapped), says
what it read at the end, --moe-trace saves the routed experts, and `fucina experts replay` runs the trace through
the cache policies; the bench reports the hit rate beside the speeds; a model too large for memory with its experts
mapped streams them unasked."""

import json

import pytest

from app.cli import main
from engine.models.expert_store import USAGE_SUFFIX, Trace, load_usage
from tests.moe_models import N_EXPERT, write_moe_model


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli-stream") / "moe.gguf"
    write_moe_model(path, "q4_k")
    return path


def test_a_streamed_reply_is_the_mapped_one_and_its_trace_replays(moe_path, tmp_path, capsys):
    ids = ["--prompt-ids", "5,9,30,2,7,11", "--max-tokens", "6"]
    assert main(["generate", str(moe_path), *ids]) == 0
    mapped = capsys.readouterr().out
    trace = tmp_path / "run.trace"
    assert main(["generate", str(moe_path), *ids, "--moe-cache-mb", "1", "--moe-trace", str(trace)]) == 0
    captured = capsys.readouterr()
    assert captured.out == mapped
    err = captured.err
    assert "experts streamed:" in err and "hit rate" in err and f"experts trace: {trace}" in err
    assert Trace.load(trace).calls
    assert load_usage(str(moe_path) + USAGE_SUFFIX)  # learned for the next run's pins
    assert main(["generate", str(moe_path), *ids, "--moe-cache-mb", "1", "--moe-prefetch"]) == 0
    captured = capsys.readouterr()
    assert captured.out == mapped and " pinned" in captured.err and "read ahead routed to" in captured.err

    assert main(["experts", "replay", str(trace), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["slots"][-1] == N_EXPERT and set(report["hit_rate"]) == {"lru", "heat", "pinned+heat", "slru",
                                                                            "pinned+lru", "belady"}
    assert report["as_run"]["heat"] == pytest.approx(float(err.split("hit rate ")[1].split("%")[0]) / 100, abs=5e-4)
    assert main(["experts", "replay", str(trace), "--slots", "2,3"]) == 0
    assert "belady" in capsys.readouterr().out
    # pins learned beside the model, from these same prompts' runs: ranked as the trace's own
    assert main(["experts", "replay", str(trace), "--json", "--pins-from", str(moe_path) + USAGE_SUFFIX]) == 0
    learned = json.loads(capsys.readouterr().out)
    assert learned["hit_rate"] == report["hit_rate"] and learned["pins_from"].endswith(USAGE_SUFFIX)


def test_bad_stream_options_and_traces_are_one_error_line(moe_path, tmp_path, capsys):
    assert main(["generate", str(moe_path), "--prompt-ids", "1,2", "--moe-cache-mb", "0"]) == 2
    assert "--moe-cache-mb must be at least 1" in capsys.readouterr().err
    assert main(["experts", "replay", str(moe_path)]) == 2
    assert "not an experts trace" in capsys.readouterr().err
    assert main(["experts", "replay", str(moe_path), "--slots", "a"]) == 2
    trace = tmp_path / "t.trace"
    Trace(layers={0: (8, 2)}, calls=[]).save(trace)
    assert main(["experts", "replay", str(trace), "--pins-from", str(moe_path)]) == 2
    assert "not an experts usage file" in capsys.readouterr().err


def test_the_bench_reports_the_streamed_experts_and_saves_their_trace(moe_path, tmp_path, capsys):
    trace = tmp_path / "bench.trace"
    assert main(["bench", str(moe_path), "--prompt-tokens", "8", "--gen-tokens", "3", "--runs", "1",
                 "--moe-cache-mb", "1", "--moe-lru", "--moe-trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "experts streamed:" in out and "lru cache of 1 MB" in out
    assert Trace.load(trace).calls


def test_a_model_too_large_for_memory_streams_its_experts_unasked_and_says_what_to_expect(moe_path, monkeypatch,
                                                                                           capsys):
    from engine.models import footprint

    ids = ["--prompt-ids", "5,9,30,2,7,11", "--max-tokens", "6"]
    assert main(["generate", str(moe_path), *ids]) == 0
    mapped = capsys.readouterr()
    assert "experts" not in mapped.err
    fp = footprint.file_footprint(moe_path)
    monkeypatch.setattr(footprint, "machine_memory",
                        lambda: footprint.RUNTIME_BYTES + fp.weight_bytes - fp.expert_bytes // 2)
    assert main(["generate", str(moe_path), *ids]) == 0
    streamed = capsys.readouterr()
    assert streamed.out == mapped.out
    assert "moe.gguf streams experts from disk: expect about" in streamed.err and "experts streamed:" in streamed.err
