"""The prefill integer GEMM (kernels/cpu/int_gemm.py) against float64 products of the values it multiplies."""

import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

from kernels.cpu import int_gemm, quant
from tests.gemm_rows import assert_rows_independent_of_batch_and_threads
from tests.quant_weights import random_weight

FORMATS = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]
PACKED = [t for t in FORMATS if int_gemm.supports(int(t), int_gemm.TILE_ROWS)]
ROWS = 3 * int_gemm.TILE_ROWS


def _quantized(qtype, X):
    """X as the GEMM sees it: each row in int16 blocks of 32 with their scales."""
    xq, xd, _ = int_gemm._input_blocks(X, int_gemm._INPUT_LIMIT[int(qtype)])
    return xq * np.repeat(xd, 32, axis=1).astype(np.float64)


def _gemm(qtype, w, X, threads=2):
    Y = np.full((X.shape[0], w.shape[0]), np.nan, np.float32)
    int_gemm.matmul_into(int(qtype), w, X, Y, threads)
    return Y


@pytest.mark.parametrize("qtype", PACKED, ids=lambda t: t.name)
def test_products_equal_float64_products_of_the_quantized_values(qtype):
    rng = np.random.default_rng(int(qtype))
    w = random_weight(qtype, ROWS, 512, rng)
    X = rng.standard_normal((11, 512), dtype=np.float32)  # two tiles of four input rows and one of three
    ref = _quantized(qtype, X) @ quants.dequantize(w, qtype).astype(np.float64).T
    got = _gemm(qtype, w, X)
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-6 * np.abs(ref).max())


@pytest.mark.parametrize("qtype", PACKED, ids=lambda t: t.name)
def test_a_row_gets_the_same_bits_whatever_the_batch(qtype):
    assert_rows_independent_of_batch_and_threads(_gemm, qtype, ROWS)


def test_prefill_uses_it_past_the_row_wise_kernels():
    """Q5_K: a format the int8 GEMM (lane_gemm) does not take, whose prefill is this one's."""
    rng = np.random.default_rng(3)
    w = random_weight(T.Q5_K, ROWS, 512, rng)
    X = rng.standard_normal((quant._MATVEC_MAX_ROWS + 3, 512), dtype=np.float32)
    if int_gemm.supports(int(T.Q5_K), ROWS):
        np.testing.assert_array_equal(quant.matmul(T.Q5_K, w, X), _gemm(T.Q5_K, w, X))
    assert not int_gemm.supports(int(T.Q5_K), ROWS + 1)  # rows that fill no tile: dequantized tiles + sgemm
    assert not int_gemm.supports(int(T.Q3_K), ROWS)


def test_sums_cannot_overflow_on_the_largest_values():
    """Every weight at its format's largest magnitude times inputs all at the block's maximum: the int32
    block sums stay exact (Q6_K's folded scales reach 128 * 32 = 4096)."""
    rows, cols = int_gemm.TILE_ROWS, 256
    X = np.full((1, cols), -3.0, np.float32)
    for qtype in PACKED:
        block_weights, block_bytes = quants.GGML_QUANT_SIZES[qtype]
        w = np.zeros((rows, cols // block_weights * block_bytes), np.uint8)
        if qtype == T.Q6_K:  # q = 0 (value -32) with scale -128 (int8 0x80)
            w.reshape(rows, -1, block_bytes)[:, :, 192:208] = 0x80
            w.reshape(rows, -1, block_bytes)[:, :, 208:210] = np.frombuffer(np.float16(1e-3).tobytes(), np.uint8)
        else:
            w[:] = 0xFF  # all-ones bits: every value at its largest, scales finite (f16 0xFFFF is NaN: set below)
            scale_bytes = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
                           T.Q4_K: (0, 2), T.Q5_K: (0, 2)}[qtype]
            for at in scale_bytes:
                w.reshape(rows, -1, block_bytes)[:, :, at:at + 2] = np.frombuffer(np.float16(1e-3).tobytes(), np.uint8)
        ref = X.astype(np.float64) @ quants.dequantize(w, qtype).astype(np.float64).T
        np.testing.assert_allclose(_gemm(qtype, w, X), ref, rtol=1e-4, err_msg=qtype.name)
