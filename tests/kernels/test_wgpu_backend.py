"""GpuBackend against CpuBackend through the seam (kernels.backend), op by op, on small synthetic shapes."""

import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

from kernels.backend import AttentionShape, Segment
from kernels.cpu.backend import CpuBackend
from kernels.wgpu.backend import GpuBackend
from tests.quant_weights import random_weight

CPU = CpuBackend()


@pytest.fixture(scope="module")
def be(gpu):
    return GpuBackend(gpu)


def _close(got, ref, tol=1e-4):
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.abs(ref).max(initial=1e-30))


def _act(be, x):
    """x on the device, as the output of an op (embedding rows of an F32 weight holding x)."""
    w = be.upload_weight(T.F32, np.ascontiguousarray(x, np.float32).view(np.uint8), *x.shape)
    return be.embed(w, np.arange(x.shape[0]), 1.0)


# Q5_0 has no shader: the backend widens it to F32 at upload
@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0, T.F16, T.Q4_1, T.Q5_0], ids=lambda t: t.name)
def test_linear_with_bias_and_embed(be, qtype):
    rng = np.random.default_rng(int(qtype))
    raw = random_weight(qtype, 6, 256, rng)
    W = quants.dequantize(raw, qtype).astype(np.float64)
    bias = rng.standard_normal(6, dtype=np.float32)
    assert be.supports(qtype)
    w = be.upload_weight(qtype, raw, 6, 256, bias)
    x = rng.standard_normal((3, 256), dtype=np.float32)
    [y] = be.linear([w], _act(be, x), row_wise=True)
    _close(be.to_host(y), x @ W.T + bias)
    ids = np.array([5, 0, 5])
    _close(be.to_host(be.embed(w, ids, 0.5)), 0.5 * W[ids], 1e-6)


def test_rmsnorm_rope_gated_add_and_take_rows(be):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3 * 16), dtype=np.float32)
    norm = rng.standard_normal(16, dtype=np.float32)
    # per-head norm (runs of len(w) values), as q/k norms use it
    _close(be.to_host(be.rmsnorm(_act(be, x), be.upload_vector(norm), 1e-6)),
           CPU.rmsnorm(x, CPU.upload_vector(norm), 1e-6))
    positions = np.array([9, 0, 4000, 5000])  # past the first RoPE table: it grows
    for neox in (True, False):
        a, ref = _act(be, x), x.copy()
        be.rope(a, positions, 16, 12, 1e6, neox)
        CPU.rope(ref, positions, 16, 12, 1e6, neox)
        _close(be.to_host(a), ref)
    y = rng.standard_normal(x.shape, dtype=np.float32)
    for activation in ("silu", "gelu"):
        _close(be.to_host(be.gated(activation, _act(be, x), _act(be, y))), CPU.gated(activation, x, y), 1e-5)
    assert np.array_equal(be.to_host(be.add(_act(be, x), _act(be, y))), x + y)
    assert np.array_equal(be.to_host(be.take_rows(_act(be, x), [3, 1])), x[[3, 1]])


@pytest.mark.parametrize("scratch_floats", [None, 4 * 12])  # room for one query row's scores: runs of one
@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_attention_over_two_segments_and_the_kv_rows(be, kv, scratch_floats, monkeypatch):
    if scratch_floats:
        monkeypatch.setattr(be, "_scratch_floats", scratch_floats)
        monkeypatch.setattr(be, "_scores", None)
    rng = np.random.default_rng(2)
    shape = AttentionShape(n_head=4, n_kv=2, head_dim=32, window=0, scale=32 ** -0.5)
    stores = {}
    for backend in (be, CPU):
        stores[backend] = [backend.kv_store([2, 2], [32, 32], 40, kv) for _ in range(2)]
    # a history written through write_f32 (as a restored sidecar is), then a prefill of one segment and a
    # decode row of another in one call
    history = rng.standard_normal((2, 2, 9, 2, 32), dtype=np.float32)
    for backend, (s0, s1) in stores.items():
        for layer in (0, 1):
            s0.write_f32(layer, 0, history[0, 0], history[0, 1])
            s1.write_f32(layer, 0, history[1, 0], history[1, 1])
    q = rng.standard_normal((4, 4 * 32), dtype=np.float32)
    k, v = rng.standard_normal((2, 4, 2 * 32), dtype=np.float32)
    outs = {}
    for backend, (s0, s1) in stores.items():
        segments = [Segment(0, 3, s0, 9), Segment(3, 4, s1, 9)]
        if backend is CPU:
            outs[backend] = CPU.attention(q, k, v, segments, 1, shape, row_wise=True)
        else:
            outs[backend] = be.to_host(be.attention(_act(be, q), _act(be, k), _act(be, v), segments, 1, shape, True))
    _close(outs[be], outs[CPU])
    (g0, g1), (c0, c1) = stores[be], stores[CPU]
    for g, c in ((g0, c0), (g1, c1)):
        assert g.row_layout(1) == c.row_layout(1)
        for got, ref in zip(g.read(1, 0, 12), c.read(1, 0, 12)):
            assert np.array_equal(got, ref)  # the storage form is byte-identical across backends
    # copy_from and write of storage-form rows
    g1.copy_from(g0, 2, 12)
    assert np.array_equal(g1.read(1, 2, 12)[0], g0.read(1, 2, 12)[0])
    assert np.array_equal(g1.read(0, 0, 2)[1], c1.read(0, 0, 2)[1])  # rows outside the range stay
    rows_k, rows_v = c0.read(0, 3, 6)
    g1.write(0, 20, rows_k, rows_v)
    assert np.array_equal(g1.read(0, 20, 23)[0], rows_k) and np.array_equal(g1.read(0, 20, 23)[1], rows_v)
    assert g0.nbytes() == (2 if kv == "f16" else 4) * 2 * 2 * 40 * 2 * 32


def test_no_adapter_is_backend_unavailable(monkeypatch):
    """What select_backend turns into its one fallback message."""
    from kernels.backend import BackendUnavailable
    from kernels.wgpu import backend
    from kernels.wgpu.device import GpuUnavailable

    def no_adapter():
        raise GpuUnavailable("no GPU adapter (no Metal or Vulkan driver found)")

    monkeypatch.setattr(backend, "gpu", no_adapter)
    with pytest.raises(BackendUnavailable, match="no GPU adapter"):
        backend.create_backend()
    assert backend.device_present() is False
