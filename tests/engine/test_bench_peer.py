"""The llama-bench peer of `fucina bench`: the workload it asks llama.cpp for, and clear errors."""

import json
import sys

import pytest

from engine.benchmarks.peer import LlamaBenchPeer
from engine.errors import FucinaError


def _fake_llama_bench(tmp_path, body: str):
    """An executable standing in for llama-bench: it logs its arguments and runs `body`."""
    log = tmp_path / "calls.jsonl"
    exe = tmp_path / "llama-bench"
    exe.write_text(f"#!{sys.executable}\nimport json, sys\n"
                   f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n{body}\n")
    exe.chmod(0o755)
    return exe, log


def test_the_peer_asks_for_our_prefill_and_our_decode_after_the_same_prompt(tmp_path):
    exe, log = _fake_llama_bench(tmp_path, "print(json.dumps([{'avg_ts': 250.0 if '-n' in sys.argv and "
                                           "sys.argv[sys.argv.index('-n') + 1] == '0' else 50.0}]))")
    run = LlamaBenchPeer("m.gguf", 2, str(exe)).run(list(range(512)), 128)
    assert (run.prefill_tps, run.decode_tps) == (250.0, 50.0)
    prefill, decode = (json.loads(line) for line in log.read_text().splitlines())
    assert prefill == ["-m", "m.gguf", "-t", "2", "-r", "1", "-o", "json", "-p", "512", "-n", "0"]
    assert decode == ["-m", "m.gguf", "-t", "2", "-r", "1", "-o", "json", "-p", "0", "-n", "128", "-d", "512"]


def test_a_missing_or_failing_llama_bench_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("FUCINA_LLAMA_BENCH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FucinaError, match="needs llama.cpp's llama-bench"):
        LlamaBenchPeer("m.gguf", 2)
    exe, _ = _fake_llama_bench(tmp_path, "sys.stderr.write('failed to load model'); sys.exit(1)")
    with pytest.raises(FucinaError, match="llama-bench failed .*failed to load model"):
        LlamaBenchPeer("m.gguf", 2, str(exe)).run([1, 2, 3], 4)


@pytest.mark.parametrize("tied", [True, False])
def test_weight_bytes_per_token_counts_one_embedding_row_unless_the_output_reuses_the_table(tmp_path, tied):
    import gguf

    from engine.benchmarks.bandwidth import weight_bytes_per_token
    from tests.synthetic import write_tiny_model

    path = tmp_path / "m.gguf"
    write_tiny_model(path, tied=tied, vocab=128)
    sizes = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors}
    embedding = sizes.pop("token_embd.weight")
    assert ("output.weight" in sizes) != tied
    expected = sum(sizes.values()) + (embedding if tied else embedding // 128)
    assert weight_bytes_per_token(path) == expected
