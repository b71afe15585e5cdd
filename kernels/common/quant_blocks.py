"""GGML weight blocks: field readers shared by the kernels, and per-format row decoders.

Layouts follow llama.cpp's ggml-common.h (mirrored by `gguf.quants`): every
block starts or ends with f16 scales, quants are packed little-endian, and
K-quant super-blocks hold 256 weights in sub-blocks of 16 or 32.

Each `decode_<format>(w, ids, out, n16)` writes the float32 values of rows
`w[ids[i]]` into `out[i]`; `decode_rows` dispatches on the GGML type id among
a set of formats (kernels.common.formats). It runs on one thread: even for
prefill tiles, decoding costs a few percent of the sgemm that follows, less
than another threaded entry point costs to compile.

Three idioms keep the inner loops vectorized by LLVM (check with `inspect_asm`):
- inner loops run `range(span(n16, 16))` or `range(span(n16, 32))`: `n16` is
  always 16 but arrives as a run-time argument, so LLVM keeps these loops for
  its loop vectorizer instead of fully unrolling them into scalar code (Numba
  runs LLVM without its SLP vectorizer), while `span` tells it the exact vector
  width to use and that no scalar remainder loop is needed.
- subscripts go through `idx()` (unsigned): Numba adds a negative-index fix-up
  to signed subscripts that LLVM cannot always prove away, and it turns vector
  loads into byte-by-byte inserts.
- bit fields come from `bits()`/`join()`, which stay uint32: Numba types Python
  integer operators as int64, and 64-bit lanes halve the throughput.
"""

import math

import numpy as np
from gguf.constants import GGMLQuantizationType as T
from numba import njit

from kernels.common.f16 import f16_bits_to_f32
from kernels.common.formats import switch

# No fast-math: reassociation lets each compilation order float sums its own way, so a cold and a warm
# cache (or a kernel inlined in two places) gave different bits. Sums that must vectorize spell their order
# out (vector accumulators in int8_dot and float_dot). numpy's error model: no zero-division checks in loops.
KERNEL = dict(cache=True, nogil=True, error_model="numpy")
# Per-format kernels have one call site (their dispatcher): inlining them there saves compiling them twice.
KERNEL_ONCE = dict(KERNEL, inline="always")

F32, F16, BF16 = int(T.F32), int(T.F16), int(T.BF16)
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = int(T.Q4_0), int(T.Q4_1), int(T.Q5_0), int(T.Q5_1), int(T.Q8_0)
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = int(T.Q2_K), int(T.Q3_K), int(T.Q4_K), int(T.Q5_K), int(T.Q6_K)
MXFP4 = int(T.MXFP4)
NATIVE_TYPES = frozenset((F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4))
# MXFP4's 4-bit e2m1 codes as ggml's kvalues_mxfp4: twice the value (int8), with E8M0 scales halved to match
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)
N16 = 16  # what callers pass as n16

idx = np.uint64


@njit(**KERNEL)
def span(n16, n):
    """n (16 or 32) computed from n16 == 16: at most n and a multiple of n, but not a constant."""
    return min(n16 * (n // 16), n) & -n


@njit(**KERNEL)
def bits(v, shift, mask):
    """(v >> shift) & mask, computed in uint32."""
    return np.bitwise_and(np.right_shift(np.uint32(v), np.uint32(shift)), np.uint32(mask))


@njit(**KERNEL)
def join(low, high, shift):
    """low | (high << shift), computed in uint32."""
    return np.bitwise_or(np.uint32(low), np.left_shift(np.uint32(high), np.uint32(shift)))


@njit(**KERNEL)
def load_f16(row, o):
    """The little-endian f16 at byte o of a row, as float32."""
    return f16_bits_to_f32(np.uint16(row[o] | (row[o + 1] << 8)))


@njit(**KERNEL)
def load_u32(row, o):
    return np.uint32(row[o] | (row[o + 1] << 8) | (row[o + 2] << 16) | (row[o + 3] << 24))


@njit(**KERNEL)
def e8m0_half(e):
    """ggml's GGML_E8M0_TO_FP32_HALF: 2^(e - 128) as float32, exactly (subnormal for e < 2)."""
    return np.float32(math.ldexp(1.0, np.int64(e) - 128))


@njit(**KERNEL)
def k_scale_min(row, o, j):
    """Q4_K/Q5_K: 6-bit (scale, min) of sub-block j, as float32, from the 12 packed bytes at o."""
    if j < 4:
        return np.float32(row[o + j] & 63), np.float32(row[o + j + 4] & 63)
    sc = (row[o + j + 4] & 15) | ((row[o + j - 4] >> 6) << 4)
    mn = ((row[o + j + 4] >> 4) & 15) | ((row[o + j] >> 6) << 4)
    return np.float32(sc), np.float32(mn)


@njit(**KERNEL)
def q3_k_scale(row, o, g):
    """Q3_K: signed 6-bit scale of 16-weight group g, as float32, from the 12 packed bytes at o."""
    low = (row[o + g] & 15) if g < 8 else ((row[o + g - 8] >> 4) & 15)
    high = (row[o + 8 + (g & 3)] >> (2 * (g >> 2))) & 3
    return np.float32((low | (high << 4)) - 32)


# --- float formats ----------------------------------------------------------


@njit(**KERNEL_ONCE)
def decode_f32(w, ids, out, n16):
    for i in range(ids.shape[0]):
        src, dst = w[ids[i]].view(np.float32), out[i]
        for c in range(dst.shape[0]):
            dst[idx(c)] = src[idx(c)]


@njit(**KERNEL_ONCE)
def decode_f16(w, ids, out, n16):
    for i in range(ids.shape[0]):
        src, dst = w[ids[i]].view(np.uint16), out[i]
        for c in range(dst.shape[0]):
            dst[idx(c)] = f16_bits_to_f32(src[idx(c)])


@njit(**KERNEL_ONCE)
def decode_bf16(w, ids, out, n16):
    for i in range(ids.shape[0]):
        src, dst = w[ids[i]].view(np.uint16), out[i].view(np.uint32)
        for c in range(dst.shape[0]):
            dst[idx(c)] = np.left_shift(np.uint32(src[idx(c)]), np.uint32(16))


# --- 32-weight blocks -------------------------------------------------------


@njit(**KERNEL_ONCE)
def decode_q4_0(w, ids, out, n16):
    # d:f16, qs[16]: weight j in the low nibble of qs[j], weight j+16 in its high nibble; d*(q-8)
    for i in range(ids.shape[0]):
        row, dst = w[ids[i]], out[i]
        for b in range(row.shape[0] // 18):
            o, e = b * 18, b * 32
            d = load_f16(row, o)
            d8 = d * np.float32(8)
            for j in range(span(n16, 16)):
                q = row[idx(o + 2 + j)]
                dst[idx(e + j)] = d * np.float32(bits(q, 0, 15)) - d8
                dst[idx(e + 16 + j)] = d * np.float32(bits(q, 4, 15)) - d8


@njit(**KERNEL_ONCE)
def decode_q4_1(w, ids, out, n16):
    # d:f16, m:f16, qs[16] as Q4_0; d*q + m
    for i in range(ids.shape[0]):
        row, dst = w[ids[i]], out[i]
        for b in range(row.shape[0] // 20):
            o, e = b * 20, b * 32
            d, m = load_f16(row, o), load_f16(row, o + 2)
            for j in range(span(n16, 16)):
                q = row[idx(o + 4 + j)]
                dst[idx(e + j)] = d * np.float32(bits(q, 0, 15)) + m
                dst[idx(e + 16 + j)] = d * np.float32(bits(q, 4, 15)) + m


@njit(**KERNEL_ONCE)
def decode_q5_0(w, ids, out, n16):
    # d:f16, qh:u32 (bit j is the 5th bit of weight j), qs[16] as Q4_0; d*(q-16)
    for i in range(ids.shape[0]):
        row, dst = w[ids[i]], out[i]
        for b in range(row.shape[0] // 22):
            o, e = b * 22, b * 32
            d, qh = load_f16(row, o), load_u32(row, o + 2)
            d16 = d * np.float32(16)
            for j in range(span(n16, 16)):
                q = row[idx(o + 6 + j)]
                dst[idx(e + j)] = d * np.float32(join(bits(q, 0, 15), bits(qh, j, 1), 4)) - d16
                dst[idx(e + 16 + j)] = d * np.float32(join(bits(q, 4, 15), bits(qh, j + 16, 1), 4)) - d16


@njit(**KERNEL_ONCE)
def decode_q5_1(w, ids, out, n16):
    # d:f16, m:f16, qh:u32, qs[16] as Q5_0; d*q + m
    for i in range(ids.shape[0]):
        row, dst = w[ids[i]], out[i]
        for b in range(row.shape[0] // 24):
            o, e = b * 24, b * 32
            d, m, qh = load_f16(row, o), load_f16(row, o + 2), load_u32(row, o + 4)
            for j in range(span(n16, 16)):
                q = row[idx(o + 8 + j)]
                dst[idx(e + j)] = d * np.float32(join(bits(q, 0, 15), bits(qh, j, 1), 4)) + m
                dst[idx(e + 16 + j)] = d * np.float32(join(bits(q, 4, 15), bits(qh, j + 16, 1), 4)) + m


@njit(**KERNEL_ONCE)
def decode_q8_0(w, ids, out, n16):
    # d:f16, qs[32] int8
    for i in range(ids.shape[0]):
        row, dst = w[ids[i]], out[i]
        for b in range(row.shape[0] // 34):
            o, e = b * 34, b * 32
            d = load_f16(row, o)
            for j in range(span(n16, 32)):
                dst[idx(e + j)] = d * np.float32(np.int8(row[idx(o + 2 + j)]))


@njit(**KERNEL_ONCE)
def decode_mxfp4(w, ids, out, n16):
    # e:E8M0, qs[16]: codes as Q4_0's nibbles; e8m0_half(e) * MXFP4_VALUES[code]
    values = MXFP4_VALUES
    for i in range(ids.shape[0]):
        row, dst = w[ids[i]], out[i]
        for b in range(row.shape[0] // 17):
            o, e = b * 17, b * 32
            d = e8m0_half(row[o])
            for j in range(span(n16, 16)):
                q = row[idx(o + 1 + j)]
                dst[idx(e + j)] = d * np.float32(values[bits(q, 0, 15)])
                dst[idx(e + 16 + j)] = d * np.float32(values[bits(q, 4, 15)])


# --- K-quants: 256-weight super-blocks --------------------------------------


@njit(**KERNEL_ONCE)
def decode_q2_k(w, ids, out, n16):
    # scales[16] (per 16 weights: scale in the low nibble, min in the high), qs[64], d:f16,
    # dmin:f16; d*sc*q - dmin*m. Weight h*128 + s*32 + l is bits 2s..2s+1 of qs[h*32 + l].
    for i in range(ids.shape[0]):
        row, dst = w[ids[i]], out[i]
        for b in range(row.shape[0] // 84):
            o, e = b * 84, b * 256
            d, dmin = load_f16(row, o + 80), load_f16(row, o + 82)
            for h in range(2):
                for s in range(4):
                    for k in range(2):
                        sc = row[o + h * 8 + s * 2 + k]
                        dl, ml = d * np.float32(sc & 15), dmin * np.float32(sc >> 4)
                        qo, eo = o + 16 + h * 32 + k * 16, e + h * 128 + s * 32 + k * 16
                        for l in range(span(n16, 16)):
                            dst[idx(eo + l)] = dl * np.float32(bits(row[idx(qo + l)], 2 * s, 3)) - ml


@njit(**KERNEL_ONCE)
def decode_q3_k(w, ids, out, n16):
    # hmask[32], qs[64], scales[12] (16 x 6-bit), d:f16; d*sc*q. Weight h*128 + s*32 + l takes
    # its low 2 bits from qs[h*32 + l] as Q2_K, and subtracts 4 unless bit 4h+s of hmask[l] is set.
    for i in range(ids.shape[0]):
        row, dst = w[ids[i]], out[i]
        for b in range(row.shape[0] // 110):
            o, e = b * 110, b * 256
            d = load_f16(row, o + 108)
            for h in range(2):
                for s in range(4):
                    for k in range(2):
                        dl = d * q3_k_scale(row, o + 96, h * 8 + s * 2 + k)
                        dl4 = dl * np.float32(4)
                        mo, qo = o + k * 16, o + 32 + h * 32 + k * 16
                        eo = e + h * 128 + s * 32 + k * 16
                        for l in range(span(n16, 16)):
                            q = join(bits(row[idx(qo + l)], 2 * s, 3), bits(row[idx(mo + l)], 4 * h + s, 1), 2)
                            dst[idx(eo + l)] = dl * np.float32(q) - dl4


@njit(**KERNEL_ONCE)
def decode_q4_k(w, ids, out, n16):
    # d:f16, dmin:f16, scales[12] (8 x 6-bit scale and min), qs[128]: sub-blocks 2c and 2c+1
    # are the low and high nibbles of qs[32c : 32c+32]; d*sc*q - dmin*m
    for i in range(ids.shape[0]):
        row, dst = w[ids[i]], out[i]
        for b in range(row.shape[0] // 144):
            o, e = b * 144, b * 256
            d, dmin = load_f16(row, o), load_f16(row, o + 2)
            for c in range(4):
                sc1, m1 = k_scale_min(row, o + 4, 2 * c)
                sc2, m2 = k_scale_min(row, o + 4, 2 * c + 1)
                d1, dm1, d2, dm2 = d * sc1, dmin * m1, d * sc2, dmin * m2
                qo, eo = o + 16 + 32 * c, e + 64 * c
                for l in range(span(n16, 32)):
                    q = row[idx(qo + l)]
                    dst[idx(eo + l)] = d1 * np.float32(bits(q, 0, 15)) - dm1
                    dst[idx(eo + 32 + l)] = d2 * np.float32(bits(q, 4, 15)) - dm2


@njit(**KERNEL_ONCE)
def decode_q5_k(w, ids, out, n16):
    # Q4_K plus qh[32] before qs: bit j of qh[l] is the 5th bit of weight l of sub-block j
    for i in range(ids.shape[0]):
        row, dst = w[ids[i]], out[i]
        for b in range(row.shape[0] // 176):
            o, e = b * 176, b * 256
            d, dmin = load_f16(row, o), load_f16(row, o + 2)
            for c in range(4):
                sc1, m1 = k_scale_min(row, o + 4, 2 * c)
                sc2, m2 = k_scale_min(row, o + 4, 2 * c + 1)
                d1, dm1, d2, dm2 = d * sc1, dmin * m1, d * sc2, dmin * m2
                qo, eo = o + 48 + 32 * c, e + 64 * c
                for l in range(span(n16, 32)):
                    q, hb = row[idx(qo + l)], row[idx(o + 16 + l)]
                    dst[idx(eo + l)] = d1 * np.float32(join(bits(q, 0, 15), bits(hb, 2 * c, 1), 4)) - dm1
                    dst[idx(eo + 32 + l)] = d2 * np.float32(join(bits(q, 4, 15), bits(hb, 2 * c + 1, 1), 4)) - dm2


@njit(**KERNEL_ONCE)
def decode_q6_k(w, ids, out, n16):
    # ql[128] low nibbles, qh[64] high 2 bits, scales[16] int8, d:f16; d*sc*(q-32).
    # In half h, weights l, l+32, l+64, l+96 come from ql[64h+l], ql[64h+32+l] (low, then
    # high nibbles) and bit pairs 0, 2, 4, 6 of qh[32h+l].
    for i in range(ids.shape[0]):
        row, dst = w[ids[i]], out[i]
        for b in range(row.shape[0] // 210):
            o, e = b * 210, b * 256
            d = load_f16(row, o + 208)
            for h in range(2):
                for k in range(2):
                    so = o + 192 + h * 8 + k
                    d1, d2 = d * np.float32(np.int8(row[so])), d * np.float32(np.int8(row[so + 2]))
                    d3, d4 = d * np.float32(np.int8(row[so + 4])), d * np.float32(np.int8(row[so + 6]))
                    lo, ho, eo = o + 64 * h + 16 * k, o + 128 + 32 * h + 16 * k, e + 128 * h + 16 * k
                    c32 = np.float32(32)
                    for l in range(span(n16, 16)):
                        a, c, hq = row[idx(lo + l)], row[idx(lo + 32 + l)], row[idx(ho + l)]
                        dst[idx(eo + l)] = d1 * (np.float32(join(bits(a, 0, 15), bits(hq, 0, 3), 4)) - c32)
                        dst[idx(eo + 32 + l)] = d2 * (np.float32(join(bits(c, 0, 15), bits(hq, 2, 3), 4)) - c32)
                        dst[idx(eo + 64 + l)] = d3 * (np.float32(join(bits(a, 4, 15), bits(hq, 4, 3), 4)) - c32)
                        dst[idx(eo + 96 + l)] = d4 * (np.float32(join(bits(c, 4, 15), bits(hq, 6, 3), 4)) - c32)


# --- entry points -----------------------------------------------------------


_decode = switch({
    Q4_K: decode_q4_k, Q6_K: decode_q6_k, Q8_0: decode_q8_0, Q5_0: decode_q5_0, Q4_0: decode_q4_0,
    Q4_1: decode_q4_1, Q5_1: decode_q5_1, Q5_K: decode_q5_k, Q3_K: decode_q3_k, Q2_K: decode_q2_k,
    F32: decode_f32, F16: decode_f16, BF16: decode_bf16, MXFP4: decode_mxfp4,
}, ("w", "ids", "out", "n16"))


@njit(**KERNEL)
def decode_rows(formats, qtype, w, ids, out, n16):
    """out[i] = W[ids[i]] as float32, W of GGML type qtype, one of `formats` (kernels.common.formats)."""
    _decode(formats, qtype, w, ids, out, n16)
