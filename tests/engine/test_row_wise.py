"""The row-wise path: m token rows in one call give, bit for bit, the logits and KV rows of feeding the
tokens one at a time, for every family, every native weight format and the starter models; and the
kernels compile to the same bits on a cold and a warm Numba cache."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from engine.models import load_model
from tests.row_wise import assert_rows_equal_one_at_a_time, random_tokens
from tests.synthetic import write_tiny_model

FAMILIES = ["llama", "qwen2", "qwen3", "gemma3"]
NATIVE = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
@pytest.mark.parametrize("qtype", NATIVE, ids=lambda t: t.name)
@pytest.mark.parametrize("arch", FAMILIES)
def test_rows_equal_one_at_a_time_for_every_family_and_format(arch, qtype, tmp_path):
    path = tmp_path / "m.gguf"
    write_tiny_model(path, arch, n_layers=3 if arch == "gemma3" else 2, n_embd=256, n_head=4, n_head_kv=2,
                     n_ff=256, vocab=64, qtype=qtype, window=16, tied=arch != "qwen2")
    assert_rows_equal_one_at_a_time(load_model(path))


def test_rows_equal_one_at_a_time_on_mxfp4_weights_in_the_fused_stack(tmp_path):
    """MXFP4 (gpt-oss's experts' format) has a native kernel, so a dense model of it runs the fused row stack."""
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "llama", n_embd=256, n_head=4, n_head_kv=2, n_ff=256, vocab=64, qtype=T.MXFP4)
    model = load_model(path)
    assert all(run.stack is not None for run in model._row_runs)
    assert_rows_equal_one_at_a_time(model)


@pytest.mark.parametrize("arch", FAMILIES)
def test_rows_equal_one_at_a_time_on_a_q8_0_cache(arch, tmp_path):
    path = tmp_path / "m.gguf"
    write_tiny_model(path, arch, n_layers=3 if arch == "gemma3" else 2, head_dim=32, n_head=8, n_ff=256, qtype=T.Q4_K, n_embd=256,
                     window=16)
    assert_rows_equal_one_at_a_time(load_model(path), "q8_0")


def test_rows_of_a_model_without_native_kernels_equal_one_at_a_time(tmp_path):
    """IQ4_NL has no native kernel: its rows go one at a time through the prefill path, same bits."""
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "llama", n_embd=256, qtype=T.IQ4_NL)
    assert_rows_equal_one_at_a_time(load_model(path))


def test_a_batched_decode_step_equals_each_conversation_alone(tmp_path):
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "qwen2", n_embd=256, qtype=T.Q5_0)
    model = load_model(path)
    prompts = [[1, 2, 3], [9, 8, 7, 6, 5], [4]]
    alone = [model.new_cache(16) for _ in prompts]
    batched = [model.new_cache(16) for _ in prompts]
    for p, a, b in zip(prompts, alone, batched):
        model.forward(p, a)
        model.forward(p, b)
    for step in range(3):
        tokens = [10 + step, 20 + step, 30 + step]
        expected = np.stack([model.forward([t], c) for t, c in zip(tokens, alone)])
        np.testing.assert_array_equal(model.decode_batch(tokens, batched), expected)
    for a, b in zip(alone, batched):
        for x, y in zip(a.k + a.v, b.k + b.v):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "gemma-3-270m"])
def test_rows_equal_one_at_a_time_on_the_starter_models(name, model_path):
    model = load_model(model_path(name))
    prompt = random_tokens(model.vocab_size, 20, seed=1)
    tokens = random_tokens(model.vocab_size, 9, seed=2)
    one, rows = model.new_cache(40), model.new_cache(40)
    model.forward(prompt, one)
    model.forward(prompt, rows)
    singles = np.stack([model.forward([t], one) for t in tokens])
    np.testing.assert_array_equal(model.forward_rows(tokens[:1], rows), singles[:1])
    np.testing.assert_array_equal(model.forward_rows(tokens[1:], rows), singles[1:])
    for a, b in zip(one.k + one.v, rows.k + rows.v):
        np.testing.assert_array_equal(a[: one.len], b[: rows.len])


_DECODE_SCRIPT = """
import json, sys
import numpy as np
from engine.models import load_model
from engine.runtime import configure_threads
configure_threads(int(sys.argv[2]))
model = load_model(sys.argv[1])
cache = model.new_cache(16)
rows = [model.forward([3, 17, 99, 5], cache)] + [model.forward([t], cache) for t in (7, 1, 42)]
rows.append(model.forward_rows([8, 9, 10], cache)[-1])
print(json.dumps(np.stack(rows).tobytes().hex()))
"""


def test_a_cold_and_a_warm_kernel_cache_give_the_same_bits(tmp_path):
    """The Numba cache starts empty (every kernel compiled in this process), then is reused; 1 and 2
    threads agree too."""
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "qwen2", n_embd=256, head_dim=64, n_head=4, qtype=T.Q4_0)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), PYTHONPATH=str(Path(__file__).parents[2]))

    def run(threads: int) -> str:
        out = subprocess.run([sys.executable, "-c", _DECODE_SCRIPT, str(path), str(threads)], env=env,
                             capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    cold = run(2)
    assert any((tmp_path / "numba").rglob("*.nbi")), "the first run should have filled the kernel cache"
    assert run(2) == cold
    assert run(1) == cold
