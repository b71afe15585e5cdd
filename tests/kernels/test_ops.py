"""Row ops and attention against plain NumPy formulas."""

import math

import numpy as np
import pytest

from kernels.backend import RopeScaling
from kernels.cpu import ops
from kernels.cpu.attention import attention_decode, attention_prefill

rng = np.random.default_rng(0)


@pytest.mark.parametrize("rows", [1, 40])
def test_rmsnorm(rows):
    x = rng.normal(size=(rows, 96)).astype(np.float32)
    w = rng.normal(size=96).astype(np.float32)
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(ops.rmsnorm(x, w, 1e-5), ref, rtol=1e-5, atol=1e-5)


def _rope_reference(x, positions, n_rot, base, neox):
    out = x.astype(np.float64).copy()
    half = n_rot // 2
    for t, pos in enumerate(positions):
        for i in range(half):
            theta = pos * base ** (-2 * i / n_rot)
            a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
            xa, xb = x[t, :, a].astype(np.float64), x[t, :, b].astype(np.float64)
            out[t, :, a] = xa * math.cos(theta) - xb * math.sin(theta)
            out[t, :, b] = xa * math.sin(theta) + xb * math.cos(theta)
    return out


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("n_rot", [32, 16])
def test_rope(neox, n_rot):
    x = rng.normal(size=(5, 3, 32)).astype(np.float32)
    pos = np.array([0, 1, 7, 100, 4000])
    y = x.copy()
    ops.rope(y, pos, n_rot, 10000.0, neox)
    np.testing.assert_allclose(y, _rope_reference(x, pos, n_rot, 10000.0, neox), rtol=1e-4, atol=1e-4)


def _yarn_reference(x, positions, n_rot, base, factor, n_ctx_orig):
    """ggml's rope_yarn (ext_factor 1, beta_fast 32, beta_slow 1, rope.scaling.attn_factor 1) in float64."""
    def corr_dim(beta):
        return n_rot * math.log(n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(0, math.floor(corr_dim(32))), min(n_rot - 1, math.ceil(corr_dim(1)))
    out = x.astype(np.float64).copy()
    half = n_rot // 2
    mscale = 1 + 0.1 * math.log(factor)
    for t, pos in enumerate(positions):
        for i in range(half):
            extrap = pos * base ** (-2 * i / n_rot)
            mix = 1 - min(1, max(0, (i - low) / max(0.001, high - low)))
            theta = extrap / factor * (1 - mix) + extrap * mix
            xa, xb = x[t, :, i].astype(np.float64), x[t, :, i + half].astype(np.float64)
            out[t, :, i] = (xa * math.cos(theta) - xb * math.sin(theta)) * mscale
            out[t, :, i + half] = (xa * math.sin(theta) + xb * math.cos(theta)) * mscale
    return out


def test_yarn_rope_mixes_scaled_and_unscaled_angles_as_ggml():
    x = rng.normal(size=(5, 3, 32)).astype(np.float32)
    pos = np.array([0, 1, 7, 100, 4000])
    y = x.copy()
    ops.rope(y, pos, 32, 10000.0, True, RopeScaling(factor=8.0, yarn=True, n_ctx_orig=64))
    np.testing.assert_allclose(y, _yarn_reference(x, pos, 32, 10000.0, 8.0, 64), rtol=1e-4, atol=1e-4)


def test_activations():
    g = rng.normal(size=(3, 50)).astype(np.float32) * 3
    u = rng.normal(size=(3, 50)).astype(np.float32)
    np.testing.assert_allclose(ops.silu_mul(g, u), g / (1 + np.exp(-g)) * u, rtol=1e-5, atol=1e-6)
    gelu = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
    np.testing.assert_allclose(ops.gelu_mul(g, u), gelu * u, rtol=1e-5, atol=1e-6)
    x, y = np.minimum(g, 7), np.clip(u * 5, -7, 7)  # gpt-oss's clamped SwiGLU
    np.testing.assert_allclose(ops.swiglu_oai(g, u * 5), x / (1 + np.exp(-1.702 * x)) * (y + 1), rtol=1e-5, atol=1e-6)
    s = ops.softmax(np.array([[1.0, 2.0, 3.0]]))
    np.testing.assert_allclose(s.sum(), 1.0)


def _attention_reference(q, k, v, pos0, window, scale, sinks=None):
    n, heads, d = q.shape
    group = heads // k.shape[1]
    out = np.zeros_like(q, dtype=np.float64)
    for i in range(n):
        p = pos0 + i
        keys = [j for j in range(p + 1) if window <= 0 or p - j < window]
        for h in range(heads):
            s = np.array([q[i, h] @ k[j, h // group] for j in keys], dtype=np.float64) * scale
            w = np.exp(s - s.max())
            w /= w.sum() + (0 if sinks is None else np.exp(sinks[h] - s.max()))
            out[i, h] = sum(wj * v[j, h // group] for wj, j in zip(w, keys))
    return out


@pytest.mark.parametrize("window", [0, 5])
def test_prefill_attention_causal_and_windowed(window):
    n_keys, pos0 = 12, 4
    q = rng.normal(size=(n_keys - pos0, 4, 16)).astype(np.float32)
    k = rng.normal(size=(n_keys, 2, 16)).astype(np.float32)
    v = rng.normal(size=(n_keys, 2, 16)).astype(np.float32)
    out = attention_prefill(q, k, v, pos0, window, 0.25)
    np.testing.assert_allclose(out, _attention_reference(q, k, v, pos0, window, 0.25), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("window", [0, 5])
def test_prefill_attention_with_sinks_in_the_denominator(window):
    n_keys, pos0 = 12, 4
    q = rng.normal(size=(n_keys - pos0, 4, 16)).astype(np.float32)
    k = rng.normal(size=(n_keys, 2, 16)).astype(np.float32)
    v = rng.normal(size=(n_keys, 2, 16)).astype(np.float32)
    sinks = np.array([-1.0, 0.5, 3.0, 20.0], np.float32)  # the last beyond every score: the max is the sink's
    out = attention_prefill(q, k, v, pos0, window, 0.25, sinks=sinks)
    np.testing.assert_allclose(out, _attention_reference(q, k, v, pos0, window, 0.25, sinks), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("window", [0, 5])
def test_decode_attention_reads_f16_bits_and_f32(window):
    n_keys = 12
    q = rng.normal(size=(4, 16)).astype(np.float32)
    k = rng.normal(size=(n_keys + 3, 2, 16)).astype(np.float16)  # rows past n_keys are ignored
    v = rng.normal(size=(n_keys + 3, 2, 16)).astype(np.float16)
    ref = _attention_reference(q[None], k.astype(np.float32), v.astype(np.float32), n_keys - 1, window, 0.25)[0]
    np.testing.assert_allclose(attention_decode(q, k.view(np.uint16), v.view(np.uint16), n_keys, window, 0.25),
                               ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(attention_decode(q, k.astype(np.float32), v.astype(np.float32), n_keys, window, 0.25),
                               ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("window", [0, 100])
@pytest.mark.parametrize("n, pos0", [(300, 20), (7, 400)])
def test_prefill_attention_over_threads_equals_one_thread_bitwise(window, n, pos0):
    # over two kv heads, so the tasks really split between the threads: past a chunk of queries, or a few
    # queries after many keys (a reopened chat's next message)
    q = rng.normal(size=(n, 4, 32)).astype(np.float32)
    k = rng.normal(size=(pos0 + n, 2, 32)).astype(np.float32)
    v = rng.normal(size=(pos0 + n, 2, 32)).astype(np.float32)
    one = attention_prefill(q, k, v, pos0, window, 0.2, threads=1)
    np.testing.assert_array_equal(attention_prefill(q, k, v, pos0, window, 0.2, threads=2), one)
    np.testing.assert_allclose(one[::37], _attention_reference(q, k, v, pos0, window, 0.2)[::37],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(2036, 2, 256), (3, 5), (0, 4)])
def test_f16_widening_is_numpys_conversion_bit_for_bit(shape):
    values = rng.normal(size=shape).astype(np.float16).reshape(-1)
    specials = np.array([np.inf, -np.inf, np.nan, 6e-8, -0.0, 65504], np.float16)  # subnormal, signed zero
    values[: min(values.size, specials.size)] = specials[: values.size]
    bits = values.reshape(shape).view(np.uint16)
    wide = ops.widen_f16(bits)
    assert wide.shape == shape and wide.dtype == np.float32
    np.testing.assert_array_equal(wide.view(np.uint32), bits.view(np.float16).astype(np.float32).view(np.uint32))
    if shape[0] > 1:  # a leading slice of a larger cache, as a KV store's read gives
        cache = np.zeros((shape[0] + 9, *shape[1:]), np.uint16)
        cache[: shape[0]] = bits
        np.testing.assert_array_equal(ops.widen_f16(cache[: shape[0]]), wide)


def test_row_ops_split_over_threads_compute_as_on_one_thread():
    # large enough to take the parallel kernels; the fused decode layer runs the serial ones per row
    x = rng.normal(size=(64, 8, 64)).astype(np.float32)
    w = rng.normal(size=64).astype(np.float32)
    serial_norm = np.empty_like(x.reshape(-1, 64))
    ops._rmsnorm_serial(x.reshape(-1, 64), w, np.float32(1e-6), serial_norm)
    np.testing.assert_array_equal(ops.rmsnorm(x, w, 1e-6).reshape(-1, 64), serial_norm)

    positions = np.arange(500, 564)
    rotated, serial = x.copy(), x.copy()
    ops.rope(rotated, positions, 64, 1e6, True)
    ops.rope_inplace(serial, positions, 64, 1e6, True)
    np.testing.assert_array_equal(rotated, serial)

    gate, up = x.reshape(64, -1), x[::-1].reshape(64, -1).copy()
    for act, fused in ((ops.SILU, ops.silu_mul), (ops.GELU, ops.gelu_mul)):
        expected = np.empty(gate.size, dtype=np.float32)
        ops._gated(act, gate.reshape(-1), up.reshape(-1), expected)
        np.testing.assert_array_equal(fused(gate, up).reshape(-1), expected)
