"""Device functions that read one weight W[r, c] from its GGUF blocks, one per format.

A weight arrives as the array its format is read from: F32 as float32 [rows, cols], F16 as float16
[rows, cols], BF16 as uint16 bit patterns, every block format as its uint8 bytes [rows, row_bytes]
(GGML's block layouts, as kernels/common/quant_blocks.py reads them). Decoding one value at a time keeps
each format a few lines; the products (kernels.py) call them over a row or a tile.
"""

import math

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import cuda, float32, int32


@cuda.jit(device=True, inline=True)
def _small_float(h, mantissa_bits, exponent_max, exponent_bias):
    """A sign-exponent-mantissa float held in the low 16 bits of h (IEEE half: 10, 31, 25; bfloat16: 7,
    255, 134, the bias counting the mantissa bits) as float32."""
    e = (h >> mantissa_bits) & exponent_max
    m = h & ((1 << mantissa_bits) - 1)
    if e == 0:
        v = math.ldexp(float32(m), 1 - exponent_bias)
    elif e == exponent_max:
        v = math.inf if m == 0 else math.nan
    else:
        v = math.ldexp(float32(m + (1 << mantissa_bits)), int(e - exponent_bias))
    return float32(-v if h & 0x8000 else v)


@cuda.jit(device=True, inline=True)
def f16_at(w, r, o):
    """The IEEE half at bytes w[r, o], w[r, o + 1] (little-endian) as float32."""
    return _small_float(int32(w[r, o]) | (int32(w[r, o + 1]) << 8), 10, 31, 25)


@cuda.jit(device=True, inline=True)
def _f32(w, r, c):
    return w[r, c]


@cuda.jit(device=True, inline=True)
def _f16(w, r, c):
    return float32(w[r, c])


@cuda.jit(device=True, inline=True)
def _bf16(w, r, c):
    return _small_float(int32(w[r, c]), 7, 255, 134)


@cuda.jit(device=True, inline=True)
def _q4_0(w, r, c):  # 18 bytes: d, 16 bytes of nibbles (low: values 0..15, high: 16..31)
    o = (c // 32) * 18
    j = c % 32
    q = (w[r, o + 2 + j] & 15) if j < 16 else (w[r, o + 2 + j - 16] >> 4)
    return f16_at(w, r, o) * float32(int32(q) - 8)


@cuda.jit(device=True, inline=True)
def _q4_1(w, r, c):  # 20 bytes: d, m, 16 bytes of nibbles
    o = (c // 32) * 20
    j = c % 32
    q = (w[r, o + 4 + j] & 15) if j < 16 else (w[r, o + 4 + j - 16] >> 4)
    return f16_at(w, r, o) * float32(q) + f16_at(w, r, o + 2)


@cuda.jit(device=True, inline=True)
def _q8_0(w, r, c):  # 34 bytes: d, 32 int8
    o = (c // 32) * 34
    q = int32(w[r, o + 2 + c % 32])
    return f16_at(w, r, o) * float32(q - 256 if q > 127 else q)


@cuda.jit(device=True, inline=True)
def _k_scale_min(w, r, o, s):
    """Sub-block s's 6-bit scale and min from a Q4_K/Q5_K super-block's 12 scale bytes at o + 4."""
    q = o + 4
    if s < 4:
        return w[r, q + s] & 63, w[r, q + s + 4] & 63
    sc = (w[r, q + s + 4] & 15) | ((w[r, q + s - 4] >> 6) << 4)
    mn = (w[r, q + s + 4] >> 4) | ((w[r, q + s] >> 6) << 4)
    return sc, mn


@cuda.jit(device=True, inline=True)
def _q4_k(w, r, c):  # 144 bytes: d, dmin, 12 scale bytes, 128 bytes of nibbles; 4 groups of 64 values
    o = (c // 256) * 144
    j = c % 256
    g, l = j // 64, j % 64
    byte = w[r, o + 16 + 32 * g + l % 32]
    q = (byte & 15) if l < 32 else (byte >> 4)
    sc, mn = _k_scale_min(w, r, o, 2 * g + l // 32)
    return f16_at(w, r, o) * float32(sc) * float32(q) - f16_at(w, r, o + 2) * float32(mn)


@cuda.jit(device=True, inline=True)
def _q5_k(w, r, c):  # 176 bytes: d, dmin, 12 scale bytes, 32 bytes of fifth bits, 128 bytes of nibbles
    o = (c // 256) * 176
    j = c % 256
    g, l = j // 64, j % 64
    byte = w[r, o + 48 + 32 * g + l % 32]
    q = int32((byte & 15) if l < 32 else (byte >> 4))
    if (w[r, o + 16 + l % 32] >> (2 * g + l // 32)) & 1:
        q += 16
    sc, mn = _k_scale_min(w, r, o, 2 * g + l // 32)
    return f16_at(w, r, o) * float32(sc) * float32(q) - f16_at(w, r, o + 2) * float32(mn)


@cuda.jit(device=True, inline=True)
def _q6_k(w, r, c):  # 210 bytes: 128 bytes low nibbles, 64 bytes high bits, 16 int8 scales, d
    o = (c // 256) * 210
    j = c % 256
    n, quarter, l = j // 128, (j % 128) // 32, j % 32
    low = w[r, o + 64 * n + l + 32 * (quarter & 1)]
    low = (low & 15) if quarter < 2 else (low >> 4)
    high = (w[r, o + 128 + 32 * n + l] >> (2 * quarter)) & 3
    q = int32(low | (high << 4)) - 32
    sc = int32(w[r, o + 192 + 8 * n + l // 16 + 2 * quarter])
    sc = sc - 256 if sc > 127 else sc
    return f16_at(w, r, o + 208) * float32(sc) * float32(q)


DECODERS = {T.F32: _f32, T.F16: _f16, T.BF16: _bf16, T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q8_0: _q8_0,
            T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k}
FLOAT_VIEWS = {T.F32: "float32", T.F16: "float16", T.BF16: "uint16"}  # else uint8 bytes


def columns(qtype: int, row_bytes: int) -> int:
    block_elems, block_bytes = GGML_QUANT_SIZES[T(qtype)]
    return row_bytes // block_bytes * block_elems
