"""Q8_0 row quantization for the KV cache: blocks of 32 values as one f16 scale + 32 int8.

Byte-compatible with GGML's block_q8_0 (and its reference rounding), so a q8_0
cache row is exactly what llama.cpp's `--cache-type-k q8_0` stores. One
implementation serves the cache's own encoder (prefill) and the row-wise kernel
(decode), so the bytes a position gets do not depend on the path that wrote it.
"""

import numpy as np
from numba import njit

from kernels.common.f16 import f16_bits_to_f32, f32_to_f16_bits
from kernels.common.quant_blocks import KERNEL

BLOCK = 32
BLOCK_BYTES = 2 + BLOCK


@njit(**KERNEL)
def quantize_row(x, out):
    """x float32 [d] (d % 32 == 0) -> out uint8 [d // 32 * 34]."""
    for b in range(x.shape[0] // BLOCK):
        amax = np.float32(0)
        for j in range(BLOCK):
            amax = max(amax, abs(x[b * BLOCK + j]))
        scale = amax / np.float32(127)
        inv = np.float32(1) / scale if scale != 0 else np.float32(0)
        bits = f32_to_f16_bits(scale)
        o = b * BLOCK_BYTES
        out[o] = bits & 0xFF
        out[o + 1] = bits >> 8
        for j in range(BLOCK):
            v = x[b * BLOCK + j] * inv
            out[o + 2 + j] = np.uint8(np.int8(np.trunc(v + np.copysign(np.float32(0.5), v))))  # roundf


@njit(**KERNEL)
def dequantize_rows(blocks):
    """uint8 [n, heads, nb * 34] -> float32 [n, heads, nb * 32]."""
    n, heads, nbytes = blocks.shape
    out = np.empty((n, heads, nbytes // BLOCK_BYTES * BLOCK), np.float32)
    for i in range(n):
        for h in range(heads):
            src, dst = blocks[i, h], out[i, h]
            for b in range(nbytes // BLOCK_BYTES):
                o = b * BLOCK_BYTES
                scale = f16_bits_to_f32(np.uint16(src[o] | (np.uint16(src[o + 1]) << np.uint16(8))))
                for j in range(BLOCK):
                    dst[b * BLOCK + j] = np.float32(np.int8(src[o + 2 + j])) * scale
    return out


@njit(**KERNEL)
def _quantize_all(rows, out):
    for i in range(rows.shape[0]):
        quantize_row(rows[i], out[i])


def quantize(x: np.ndarray) -> np.ndarray:
    """float32 [..., d] (d % 32 == 0) -> uint8 [..., d // 32 * 34]."""
    *lead, d = x.shape
    rows = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, d)
    out = np.empty((rows.shape[0], d // BLOCK * BLOCK_BYTES), np.uint8)
    _quantize_all(rows, out)
    return out.reshape(*lead, d // BLOCK * BLOCK_BYTES)


def dequantize(blocks: np.ndarray) -> np.ndarray:
    """uint8 [..., nb * 34] -> float32 [..., nb * 32]."""
    *lead, nbytes = blocks.shape
    out = dequantize_rows(np.ascontiguousarray(blocks).reshape(-1, 1, nbytes))
    return out.reshape(*lead, nbytes // BLOCK_BYTES * BLOCK)
