"""The WGSL kernels against gguf.quants' dequantizers and the CPU kernels, on small synthetic shapes."""

import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

from kernels.common import q8_0
from kernels.cpu import ops as cpu_ops
from kernels.cpu.attention import attention_decode, attention_prefill
from kernels.wgpu import ops
from tests.quant_weights import random_weight

# Columns: several blocks; float formats at widths that are no multiple of 16 (odd f16 rows start mid-word).
COLS = {T.F32: 37, T.F16: 53, T.BF16: 40, T.Q4_0: 160, T.Q4_1: 96, T.Q8_0: 224, T.Q4_K: 512, T.Q6_K: 768}
ROWS = 7


def _upload_case(gpu, qtype, seed=0):
    rng = np.random.default_rng(seed + int(qtype))
    w = random_weight(qtype, ROWS, COLS[qtype], rng)
    return ops.upload_weight(gpu, qtype, w), quants.dequantize(w, qtype).astype(np.float64), rng


@pytest.mark.parametrize("m", [1, 11])  # a decode row; more rows than one workgroup's tile of 8
@pytest.mark.parametrize("qtype", list(COLS), ids=lambda t: t.name)
def test_matmul_reads_the_blocks(gpu, qtype, m):
    w, W, rng = _upload_case(gpu, qtype)
    X = rng.standard_normal((m, W.shape[1]), dtype=np.float32)
    y = gpu.empty(m * ROWS * 4)
    ops.matmul(gpu, w, gpu.upload(X), m, y)
    got = gpu.read(y, np.float32, (m, ROWS))
    bound = 2e-6 * np.sqrt(W.shape[1]) * (np.abs(X) @ np.abs(W).T) + 1e-30
    assert np.all(np.abs(got - X @ W.T) <= bound)


def test_matmul_adds_the_bias_and_fills_its_part_of_a_fused_output(gpu):
    w, W, rng = _upload_case(gpu, T.Q8_0)
    X = rng.standard_normal((2, W.shape[1]), dtype=np.float32)
    bias = rng.standard_normal(ROWS, dtype=np.float32)
    y = gpu.upload(np.full((2, 10), -1.0, np.float32))
    ops.matmul(gpu, w, gpu.upload(X), 2, y, bias=gpu.upload(bias), out_stride=10, out_offset=2)
    got = gpu.read(y, np.float32, (2, 10))
    np.testing.assert_allclose(got[:, 2:9], X @ W.T + bias, rtol=1e-5, atol=1e-5)
    assert np.all(got[:, :2] == -1) and np.all(got[:, 9:] == -1)


def test_a_weight_past_the_binding_limit_is_split_into_row_chunks(gpu, monkeypatch):
    monkeypatch.setattr(gpu, "max_binding", 3 * 224 // 32 * 34)  # three Q8_0 rows per chunk
    w, W, rng = _upload_case(gpu, T.Q8_0)
    assert [(c.row0, c.rows) for c in w.chunks] == [(0, 3), (3, 3), (6, 1)]
    X = rng.standard_normal((2, W.shape[1]), dtype=np.float32)
    y = gpu.empty(2 * ROWS * 4)
    ops.matmul(gpu, w, gpu.upload(X), 2, y)
    np.testing.assert_allclose(gpu.read(y, np.float32, (2, ROWS)), X @ W.T, rtol=1e-5, atol=1e-5)
    ids = np.array([6, 1, 4], np.uint32)
    out = gpu.empty(3 * W.shape[1] * 4)
    ops.get_rows(gpu, w, gpu.upload(ids), 3, out)
    np.testing.assert_allclose(gpu.read(out, np.float32, (3, W.shape[1])), W[ids], rtol=1e-6)


def test_matmul_folds_workgroups_past_a_dispatch_dimension(gpu, monkeypatch):
    monkeypatch.setattr(ops, "_ROW_GROUPS", 2)  # 40 rows in workgroups of 16: three, over x and z
    rng = np.random.default_rng(7)
    raw = random_weight(T.Q8_0, 40, 64, rng)
    W = quants.dequantize(raw, T.Q8_0)
    x = rng.standard_normal((1, 64), dtype=np.float32)
    y = gpu.empty(40 * 4)
    ops.matmul(gpu, ops.upload_weight(gpu, T.Q8_0, raw), gpu.upload(x), 1, y)
    np.testing.assert_allclose(gpu.read(y, np.float32, (1, 40)), x @ W.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qtype", list(COLS), ids=lambda t: t.name)
def test_get_rows(gpu, qtype):
    w, W, _ = _upload_case(gpu, qtype)
    ids = np.array([3, 0, 6, 3], np.uint32)
    out = gpu.empty(4 * W.shape[1] * 4)
    ops.get_rows(gpu, w, gpu.upload(ids), 4, out, scale=2.0)
    np.testing.assert_allclose(gpu.read(out, np.float32, (4, W.shape[1])), 2 * W[ids], rtol=1e-6, atol=1e-7)


def test_a_type_without_a_shader_is_refused(gpu):
    with pytest.raises(ops.UnsupportedGpuWeight, match="Q5_K"):
        ops.upload_weight(gpu, T.Q5_K, np.zeros((1, 176), np.uint8))


def test_rmsnorm_rows_and_heads_in_a_fused_row(gpu):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 200), dtype=np.float32)
    w = rng.standard_normal(200, dtype=np.float32)
    out = gpu.empty(x.nbytes)
    ops.rmsnorm(gpu, gpu.upload(x), gpu.upload(w), out, 200, 3, 1e-5)
    np.testing.assert_allclose(gpu.read(out, np.float32, x.shape), cpu_ops.rmsnorm(x, w, 1e-5), rtol=1e-5, atol=1e-6)
    # two heads of 16 at offset 8 of 48-float rows, normed in place; the rest of the row untouched
    fused = rng.standard_normal((3, 48), dtype=np.float32)
    buf = gpu.upload(fused)
    ops.rmsnorm(gpu, buf, gpu.upload(w[:16].copy()), buf, 16, 3, 1e-6, heads=2, stride=48, offset=8)
    got = gpu.read(buf, np.float32, fused.shape)
    heads = fused[:, 8:40].reshape(3, 2, 16)
    np.testing.assert_allclose(got[:, 8:40].reshape(3, 2, 16), cpu_ops.rmsnorm(heads, w[:16], 1e-6), rtol=1e-5,
                               atol=1e-6)
    assert np.array_equal(got[:, :8], fused[:, :8]) and np.array_equal(got[:, 40:], fused[:, 40:])


@pytest.mark.parametrize("neox", [True, False])
def test_rope(gpu, neox):
    rng = np.random.default_rng(2)
    n, heads, d, n_rot, pos0 = 3, 2, 16, 12, 40  # partial rotation: dims past n_rot stay
    x = rng.standard_normal((n, heads, d), dtype=np.float32)
    buf = gpu.upload(x)
    positions = np.array([pos0, 0, pos0 + 7])  # rows of different segments sit at unrelated positions
    ops.rope(gpu, buf, ops.rope_table(gpu, n_rot, 10000.0, 64), gpu.upload(positions.astype(np.uint32)), n, heads,
             d, n_rot, neox)
    ref = x.copy()
    cpu_ops.rope(ref, positions, n_rot, 10000.0, neox)
    np.testing.assert_allclose(gpu.read(buf, np.float32, x.shape), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act,cpu", [(ops.SILU, cpu_ops.silu_mul), (ops.GELU, cpu_ops.gelu_mul)])
def test_gated_activation(gpu, act, cpu):
    rng = np.random.default_rng(3)
    gate, up = (3 * rng.standard_normal((2, 2, 70))).astype(np.float32)
    out = gpu.empty(2 * 70 * 4)
    ops.gated(gpu, gpu.upload(gate), gpu.upload(up), out, 2 * 70, act)
    ref = cpu(gate, up)
    np.testing.assert_allclose(gpu.read(out, np.float32, (2, 70)), ref, rtol=1e-5, atol=1e-6)


def test_add(gpu):
    x, y = np.arange(100, dtype=np.float32), np.full(100, 0.5, np.float32)
    out = gpu.empty(400)
    ops.add(gpu, gpu.upload(x), gpu.upload(y), out, 100)
    assert np.array_equal(gpu.read(out, np.float32, (100,)), x + y)


def _cache_case(gpu, kv_dtype, n_keys, kv_heads, d, capacity, rng):
    """Rows [0, n_keys) of a cache written through kv_store; the CPU arrays beside."""
    k = rng.standard_normal((n_keys, kv_heads, d), dtype=np.float32)
    v = rng.standard_normal((n_keys, kv_heads, d), dtype=np.float32)
    width = kv_heads * d
    item = 2 if kv_dtype == "f16" else 4
    kc, vc = gpu.empty(capacity * width * item), gpu.empty(capacity * width * item)
    ks, vs = gpu.upload(k), gpu.upload(v)
    split = n_keys // 2  # two appends, the second from a row offset of the sources
    ops.kv_store(gpu, kv_dtype, ks, vs, kc, vc, split, width, 0)
    ops.kv_store(gpu, kv_dtype, ks, vs, kc, vc, n_keys - split, width, split, src_row0=split)
    if kv_dtype == "f16":
        return kc, vc, k.astype(np.float16).view(np.uint16), v.astype(np.float16).view(np.uint16)
    return kc, vc, k, v


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
def test_kv_store_writes_the_cpu_cache_layout(gpu, kv_dtype):
    rng = np.random.default_rng(4)
    kc, vc, k, v = _cache_case(gpu, kv_dtype, 5, 2, 8, 9, rng)
    dtype = np.uint16 if kv_dtype == "f16" else np.float32
    assert np.array_equal(gpu.read(kc, dtype, (5, 2, 8)), k)
    assert np.array_equal(gpu.read(vc, dtype, (5, 2, 8)), v)


def test_kv_store_rounds_a_q8_0_cache_as_ggml_does(gpu):
    rng = np.random.default_rng(6)
    k, v = rng.standard_normal((2, 3, 2, 64), dtype=np.float32)
    k[0, 1, :32] = 0  # an all-zero block has scale 0
    kc, vc = gpu.empty(k.nbytes), gpu.empty(v.nbytes)
    ops.kv_store(gpu, "q8_0", gpu.upload(k), gpu.upload(v), kc, vc, 3, 128, 0)
    for buf, ref in ((kc, k), (vc, v)):
        got = gpu.read(buf, np.float32, ref.shape)
        assert np.array_equal(got, q8_0.dequantize(q8_0.quantize(ref)))
        assert np.array_equal(q8_0.quantize(got), q8_0.quantize(ref))  # the bytes come back from the values


@pytest.mark.parametrize("window", [0, 7])
@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
def test_attention_decode_and_prefill(gpu, kv_dtype, window):
    rng = np.random.default_rng(5)
    n_head, kv_heads, d, n_keys, n = 4, 2, 32, 90, 3  # grouped heads; more keys than a workgroup's threads
    kc, vc, k, v = _cache_case(gpu, kv_dtype, n_keys, kv_heads, d, 100, rng)
    q = rng.standard_normal((n, n_head, d), dtype=np.float32)
    scale = 1 / np.sqrt(d)
    scores, out = gpu.empty(n * n_head * n_keys * 4), gpu.empty(q.nbytes)
    # the last n keys' queries at once (prefill), then the last one alone (decode) from its row of q
    qs = gpu.upload(q)
    ops.attention(gpu, kv_dtype, qs, kc, vc, scores, out, n, n_head, kv_heads, d, n_keys - n, window, scale)
    kf = k.view(np.float16).astype(np.float32) if kv_dtype == "f16" else k
    vf = v.view(np.float16).astype(np.float32) if kv_dtype == "f16" else v
    ref = attention_prefill(q, kf, vf, n_keys - n, window, scale)
    np.testing.assert_allclose(gpu.read(out, np.float32, q.shape), ref, rtol=1e-4, atol=1e-5)
    out = gpu.empty(q.nbytes)
    ops.attention(gpu, kv_dtype, qs, kc, vc, scores, out, 1, n_head, kv_heads, d, n_keys - 1, window, scale,
                  q_row0=n - 1)
    ref = attention_decode(np.ascontiguousarray(q[-1]), k, v, n_keys, window, scale)
    np.testing.assert_allclose(gpu.read(out, np.float32, q.shape)[-1], ref, rtol=1e-4, atol=1e-5)


def test_no_wgpu_package_is_a_clear_gpu_unavailable(monkeypatch):
    from kernels.wgpu.device import Gpu, GpuUnavailable

    monkeypatch.setitem(__import__("sys").modules, "wgpu", None)  # import wgpu now raises ImportError
    with pytest.raises(GpuUnavailable, match=r"needs the wgpu package .*fucina\[gpu\]"):
        Gpu()
