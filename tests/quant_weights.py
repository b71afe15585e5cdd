"""Random GGML weight bytes, uint8 [rows, row_bytes], for kernel tests and benchmarks."""

from __future__ import annotations

import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from kernels.cpu import int8_dot, k_quant_dot

# Matvecs of these formats multiply x quantized to int8 blocks of 32, and of the K-quants here to int8 blocks of
# 256 (as llama.cpp does: its Q8_0 and Q8_K).
INT8_INPUTS = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4}
SUPER_BLOCK_INPUTS = {T.Q4_K, T.Q6_K}

# Byte offsets of the f16 scale fields in one block, for formats built from random bytes
# (every bit pattern of the quants is then exercised, and the scales stay finite).
SCALE_FIELDS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.IQ4_NL: (0,),
}


# MXFP4's E8M0 scale byte e (2^(e - 128) per unit of its doubled e2m1 values): 2^-10 .. 2^-1
MXFP4_SCALE_BYTES = (118, 128)


def random_weight(qtype: T, rows: int, cols: int, rng: np.random.Generator,
                  scale_range: tuple[float, float] = (1e-3, 1e-1)) -> np.ndarray:
    """Random blocks with f16 scales in ±scale_range (MXFP4: E8M0 scales of MXFP4_SCALE_BYTES); float and
    other types from N(0, 1) values."""
    if qtype == T.MXFP4:
        blocks = rng.integers(0, 256, (rows * cols // 32, 17), dtype=np.uint8)
        blocks[:, 0] = rng.integers(*MXFP4_SCALE_BYTES, blocks.shape[0])
        return blocks.reshape(rows, -1)
    if qtype in SCALE_FIELDS:
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        n_blocks = rows * cols // block_elems
        blocks = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
        for offset in SCALE_FIELDS[qtype]:
            scales = rng.uniform(*scale_range, n_blocks) * rng.choice([-1.0, 1.0], n_blocks)
            blocks[:, offset : offset + 2] = scales.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
        return blocks.reshape(rows, -1)
    values = rng.standard_normal((rows, cols), dtype=np.float32)
    if qtype == T.F32:
        return values.view(np.uint8)
    if qtype == T.F16:
        return values.astype(np.float16).view(np.uint8)
    return quants.quantize(values, qtype)  # BF16, TQ1_0, TQ2_0, MXFP4, ...


def matvec_input(qtype: int, X: np.ndarray) -> np.ndarray:
    """The rows of X [n, cols] as the matvec kernels of qtype see them."""
    if qtype in SUPER_BLOCK_INPUTS:
        return np.stack([q * np.repeat(d, 256) for q, d, _ in map(super_block_input, X)]).astype(np.float32)
    if qtype not in INT8_INPUTS:
        return X
    return np.stack([xq * np.repeat(xd, 32) for xq, xd, _ in map(int8_dot.quantize, X)]).astype(np.float32)


def super_block_input(x: np.ndarray):
    """x quantized by k_quant_dot.quantize_into: (int8 values, float32 scale per 256, int16 sums of 16)."""
    q, d, bsums = np.empty(x.size, np.int8), np.empty(x.size // 256, np.float32), np.empty(x.size // 16, np.int16)
    k_quant_dot.quantize_into(np.ascontiguousarray(x, np.float32), q, d, bsums)
    return q, d, bsums
