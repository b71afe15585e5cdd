"""The K-quants' int8 prefill GEMM (kernels/cpu/lane_gemm.py) against float64 products of the values it
multiplies, its rows' independence of the batch, and where prefill takes it (dense products, MoE experts)."""

import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

from kernels.backend import Gating, MoeSpec
from kernels.cpu import int_gemm, lane_gemm, quant
from kernels.cpu import moe as cpu_moe
from kernels.cpu.backend import CpuBackend
from kernels.cpu.expert_rows import gemm_outputs
from tests.gemm_rows import assert_rows_independent_of_batch_and_threads
from tests.quant_weights import random_weight

pytestmark = pytest.mark.skipif(not lane_gemm.supports(int(T.Q4_K)), reason="the int8 GEMM needs AVX2")
FORMATS = [T.Q4_K, T.Q6_K]
ROWS = 3 * 16 + 5  # three tiles of 16 weight rows and a short one


def _gemm(qtype, w, X, threads=2):
    Y = np.full((X.shape[0], w.shape[0]), np.nan, np.float32)
    lane_gemm.matmul_into(int(qtype), w, X, Y, threads)
    return Y


def _quantized(X):
    """X as the GEMM sees it: int8 blocks of 256 with their scales."""
    inputs = lane_gemm.quantize(X, 1)
    assert np.abs(inputs.xq.astype(np.int32)).max() <= 127
    return inputs.xq * np.repeat(inputs.xd, 256, axis=1).astype(np.float64)


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_products_equal_float64_products_of_the_quantized_values(qtype):
    rng = np.random.default_rng(int(qtype))
    w = random_weight(qtype, ROWS, 512, rng)
    X = (rng.standard_normal((11, 512)) * np.linspace(0.1, 9, 512)).astype(np.float32)  # tiles of 4, 4 and 3
    ref = _quantized(X) @ quants.dequantize(w, qtype).astype(np.float64).T
    np.testing.assert_allclose(_gemm(qtype, w, X), ref, rtol=0, atol=2e-6 * np.abs(ref).max())


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_a_row_gets_the_same_bits_whatever_the_batch_or_threads(qtype):
    assert_rows_independent_of_batch_and_threads(_gemm, qtype, ROWS)


def test_sums_stay_exact_on_the_largest_values():
    """Every value at its format's largest magnitude, the inputs at the int8 limit: the int32 block sums do
    not overflow (Q4_K: 32 * 15 * 127 a sub-block; Q6_K's scale -128 applied in float)."""
    X = np.full((1, 256), -3.0, np.float32)
    f16 = np.frombuffer(np.float16(1e-3).tobytes(), np.uint8)
    for qtype in FORMATS:
        w = np.full((16, 144 if qtype == T.Q4_K else 210), 0xFF, np.uint8)
        if qtype == T.Q4_K:
            w[:, 0:2] = w[:, 2:4] = f16
        else:
            w[:, 192:208] = 0x80
            w[:, 208:210] = f16
        ref = X.astype(np.float64) @ quants.dequantize(w, qtype).astype(np.float64).T
        np.testing.assert_allclose(_gemm(qtype, w, X), ref, rtol=1e-5, err_msg=qtype.name)


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_prefill_takes_it_from_its_row_count_and_the_row_kernels_below(qtype):
    """A dense product of MATMUL_FROM_ROWS input rows or more has the GEMM's bits, one of a row fewer the row
    kernels' (which differ: the GEMM rounds its sums otherwise)."""
    rng = np.random.default_rng(3)
    first = lane_gemm.MATMUL_FROM_ROWS[int(qtype)]
    assert first <= quant._MATVEC_MAX_ROWS
    w = random_weight(qtype, ROWS, 512, rng)
    for n in (first, first + 1, quant._MATVEC_MAX_ROWS + 3):
        X = rng.standard_normal((n, 512), dtype=np.float32)
        np.testing.assert_array_equal(quant.matmul(qtype, w, X), _gemm(qtype, w, X))
    X = rng.standard_normal((first - 1, 512), dtype=np.float32)
    by_rows = quant.rows(qtype, w, X)
    np.testing.assert_array_equal(quant.matmul(qtype, w, X), by_rows)
    assert not np.array_equal(by_rows, _gemm(qtype, w, X))
    assert not lane_gemm.supports(int(T.Q5_K)) and int_gemm.supports(int(T.Q5_K), int_gemm.TILE_ROWS)


N_EXPERT, K, N_EMBD, N_FF = 8, 2, 256, 512


def _experts(backend, rng):
    def stacked(qtype, rows, cols):
        return backend.upload_weight(qtype, random_weight(qtype, N_EXPERT * rows, cols, rng), N_EXPERT * rows, cols)

    return MoeSpec(gate=stacked(T.Q4_K, N_FF, N_EMBD), up=stacked(T.Q4_K, N_FF, N_EMBD),
                   down=stacked(T.Q6_K, N_EMBD, N_FF), n_expert=N_EXPERT, n_used=K, gating=Gating.SOFTMAX,
                   normalize=True, scale=1.0)


def test_a_long_prefills_experts_take_it_and_agree_with_the_row_wise_experts(monkeypatch):
    rng = np.random.default_rng(4)
    backend = CpuBackend()
    spec = _experts(backend, rng)
    x = rng.standard_normal((64, N_EMBD)).astype(np.float32)  # 128 pairs over 8 experts: 16 rows each
    logits = rng.normal(0, 1, (64, N_EXPERT)).astype(np.float32)
    taken = []
    monkeypatch.setattr(cpu_moe, "gemm_outputs", lambda *a: taken.append(1) or gemm_outputs(*a))
    prefill = backend.moe_ffn(spec, x, logits, row_wise=False)
    assert taken, "the experts' products did not take the GEMM"
    rows = backend.moe_ffn(spec, x, logits, row_wise=True)
    np.testing.assert_allclose(prefill, rows, rtol=0, atol=0.02 * np.abs(rows).max())
    # each row's output is its own, whatever else was routed with it
    np.testing.assert_array_equal(backend.moe_ffn(spec, x[:60], logits[:60], row_wise=False), prefill[:60])


def test_a_short_prefills_experts_stay_row_wise():
    rng = np.random.default_rng(5)
    backend = CpuBackend()
    spec = _experts(backend, rng)
    x = rng.standard_normal((20, N_EMBD)).astype(np.float32)  # 40 pairs: 5 rows an expert
    logits = rng.normal(0, 1, (20, N_EXPERT)).astype(np.float32)
    np.testing.assert_array_equal(backend.moe_ffn(spec, x, logits, row_wise=False),
                                  backend.moe_ffn(spec, x, logits, row_wise=True))

