"""Decode attention with the queries of a kv head side by side in lanes gives each query the bits of the
head-by-head kernel, whatever the group size, the number of rows, the window, the sinks or the cache type."""

import numpy as np
import pytest

import engine  # noqa: F401  (sets up Numba's threads before the kernels load)
from kernels.cpu.attention import decode_heads
from kernels.cpu.attention_lanes import attend_lanes, attend_rows

SCALE = np.float32(0.125)
NO_SINKS = np.zeros(0, np.float32)


def _sinks(n_head, with_sinks):
    return np.linspace(-2, 3, n_head).astype(np.float32) if with_sinks else NO_SINKS


def _case(n_head, n_kv, d, first, m, f16, seed=0):
    rng = np.random.default_rng(seed)
    n = first + m
    q = rng.normal(size=(m, n_head, d)).astype(np.float32)
    k = (rng.normal(size=(n + 5, n_kv, d)) * 2).astype(np.float16)
    v = rng.normal(size=(n + 5, n_kv, d)).astype(np.float16)
    if f16:
        k, v = k.view(np.uint16), v.view(np.uint16)
    else:
        k, v = k.astype(np.float32), v.astype(np.float32)
    return q, k, v, np.arange(first + 1, n + 1, dtype=np.int64)


def _head_by_head(q, k, v, n_keys, window, sinks):
    out = np.empty_like(q)
    for i in range(q.shape[0]):
        decode_heads(q[i], k, v, n_keys[i], window, SCALE, sinks, out[i])
    return out


@pytest.mark.parametrize("with_sinks", [False, True], ids=["", "sinks"])
@pytest.mark.parametrize("f16", [True, False], ids=["f16", "f32"])
@pytest.mark.parametrize("n_head, n_kv, d, first, m, window", [
    (14, 2, 64, 100, 1, 0),     # Qwen2.5's groups of 7, one row
    (14, 2, 64, 700, 12, 0),    # a verify step: 84 queries per kv head, 6 vectors
    (9, 3, 64, 33, 7, 0),       # SmolLM2's groups of 3
    (4, 1, 256, 600, 5, 512),   # Gemma 3's wide heads and sliding window, rows crossing it
    (8, 8, 32, 50, 3, 20),      # no grouping
    (14, 2, 64, 3, 17, 4),      # a window shorter than the rows, early positions
    (32, 4, 128, 300, 3, 0),    # Qwen3-30B-A3B's groups of 8: decode_heads' tasks share each key and value row
    (16, 2, 256, 200, 2, 0),    # Qwen3.5's: four tasks of four heads
    (64, 8, 64, 150, 2, 128),   # gpt-oss: groups of 8, its 128-key window
])
def test_lanes_give_each_query_the_bits_of_head_by_head(n_head, n_kv, d, first, m, window, f16, with_sinks):
    q, k, v, n_keys = _case(n_head, n_kv, d, first, m, f16)
    sinks = _sinks(n_head, with_sinks)
    expected = _head_by_head(q, k, v, n_keys, window, sinks)
    lanes = np.empty_like(q)
    attend_lanes(q, k, v, n_keys, window, SCALE, sinks, lanes)
    np.testing.assert_array_equal(lanes, expected)
    chosen = np.empty_like(q)
    attend_rows(q, k, v, n_keys, window, SCALE, sinks, chosen)
    np.testing.assert_array_equal(chosen, expected)


@pytest.mark.parametrize("with_sinks", [False, True], ids=["", "sinks"])
def test_lanes_attend_within_each_rows_own_keys(with_sinks):
    """Against float64 attention: row i sees keys [max(0, n_i - window), n_i) and nothing else; a head's
    sink is one more logit in its softmax's denominator (ggml's soft_max_ext), with no value."""
    q, k, v, n_keys = _case(6, 2, 32, 40, 9, f16=False, seed=3)
    window = 16
    sinks = _sinks(6, with_sinks)
    out = np.empty_like(q)
    attend_lanes(q, k, v, n_keys, window, SCALE, sinks, out)
    for i, n in enumerate(n_keys):
        lo = max(0, n - window)
        for h in range(6):
            s = k[lo:n, h // 3].astype(np.float64) @ q[i, h].astype(np.float64) * float(SCALE)
            top = max(s.max(), sinks[h]) if with_sinks else s.max()
            p = np.exp(s - top)
            denominator = p.sum() + (np.exp(sinks[h] - top) if with_sinks else 0)
            want = (p / denominator) @ v[lo:n, h // 3].astype(np.float64)
            np.testing.assert_allclose(out[i, h], want, rtol=2e-5, atol=2e-6)
