"""The prefill product of K-quant weights as an int8 GEMM on vector lanes.

int_gemm multiplies int16 values by 15-bit inputs, 32 products per `vpdpwssd`. The K-quants' values fit in a
byte (Q4_K's 0-15, Q6_K's 0-63), so with inputs in int8, one `vpdpbusd` does 64: the arithmetic of a long
prompt's products, the cost past a few rows, halves (without VNNI, `pmaddubsw`'s exact int16 pair sums are
added several quads at a time before one `pmaddwd` widens them: half of int_gemm's instructions on AVX2 too).
The inputs are llama.cpp's for these formats (Q8_K:
int8 blocks of 256, k_quant_dot.quantize_into), as the row-wise products' are: with 8-bit blocks of 32
instead, rounded unlike the reference's, Qwen2.5's prefill with a q8_0 KV cache lost its agreement with
llama.cpp at margin 1 (96.7%); with the same rounding it keeps it (100%), and every starter meets its bars at
the row-wise products' precision.

A tile of 16 weight rows is unpacked by the lanes' unpacker (k_quant_lanes: four values of each row side by
side, in column order, the tile's quad q holding columns 4q .. 4q + 3), its sub-block scales and mins made
float lanes, and up to four input rows pass over it at once: per block of the format's scale (Q4_K's 32
weights, Q6_K's 16) one int32 sum per lane, then in float acc += s * isum * xd - o * xs, with w = s * q - o
(Q4_K: s = d * scale, o = dmin * min; Q6_K: s = d * scale, o = 32 s) and xs = xd * the block's input sum.

Unlike the row lanes, a row's bits are not the row-wise product's: prefill's own (as int_gemm's), the same
sequence for a row whatever the number of input rows, their tile of four, or the threads.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from kernels.common import formats
from kernels.common import quant_blocks as qb
from kernels.common.cpu_target import has
from kernels.common.formats import switch
from kernels.common.quant_blocks import KERNEL
from kernels.cpu import int_gemm, k_quant_dot, k_quant_lanes
from kernels.cpu.int8_dot import _call, multiply_add
from kernels.cpu.int_gemm import _splat
from kernels.cpu.row_lanes import _FVEC, _IVEC, ROWS, _store_rows

_AVX2 = has("avx2")
_AVX512 = _AVX2 and has("avx512bw")
_VNNI = _AVX512 and has("avx512vnni")

# format -> weights per scale: the block of weights each float step covers
_BLOCK = {qb.Q4_K: 32, qb.Q6_K: 16}
# without VNNI, four-product sums come from pmaddubsw's int16 pairs, added in int16 before widening: as many
# quads as keep a pair's sum exact (2 * value * 127 each: Q4_K's values below 16, Q6_K's below 64)
_INT16_QUADS = {qb.Q4_K: 8, qb.Q6_K: 2}
# input rows per expert, on average, from which a prefill's experts take this GEMM: unpacking a tile costs
# about what the row kernels' work for a few rows does (2 threads, AVX-512 VNNI, one expert of the Qwen3.5
# shape, row kernels' time / GEMM's: its Q4_K gate 0.82 at one row, 1.07 at six, 1.02 at eight, 1.36 at 20;
# its Q6_K down 0.74 at one, 0.95 at six, 1.00 at eight, 1.26 at 20)
MIN_INPUT_ROWS = 8
# input rows from which a dense product takes this GEMM rather than the row kernels (quant.matmul): the
# row kernels' int8 dots cost per input row what the GEMM's tiles cost once (2 threads, AVX-512 VNNI, row
# kernels' time / GEMM's, the Qwen3.5 shape's matrices, each read from memory: Q4_K 8192 x 2048 1.16 at six
# rows, 1.15 at eight, 1.58 at 20; Q4_K 2048 x 4096 1.01 at six, 1.08 at eight; Q6_K 4096 x 2048 0.96 at
# eight, 1.11 at twelve, 1.23 at 20). Both crossings are the same on every host, so a prompt takes the same
# products, and gets the same bits, whatever the CPU (not measured on AVX2, whose GEMM lacks vpdpbusd)
MATMUL_FROM_ROWS = {qb.Q4_K: 8, qb.Q6_K: 12}

_I32, _I64 = ir.IntType(32), ir.IntType(64)


def supports(qtype: int) -> bool:
    """Whether this host runs the int8 GEMM for a weight of this type (every host with AVX2: the sums are
    exact and the float steps the same per lane, so its bits are those of AVX-512's, tested)."""
    return _AVX2 and qtype in _BLOCK


class Inputs(NamedTuple):
    """Input rows as the GEMM reads them: llama.cpp's Q8_K blocks of 256, x ~ xd * xq."""

    xq: np.ndarray    # int8 [m, cols]
    xd: np.ndarray    # float32 [m, cols / 256]
    xs32: np.ndarray  # float32 [m, cols / 32]: xd * each 32's sum of xq
    xs16: np.ndarray  # float32 [m, cols / 16]: xd * each 16's sum of xq


@njit(**KERNEL)
def _quantize_rows(X, inputs, lo, hi):
    """Rows [lo, hi) of inputs from X (k_quant_dot.quantize_into: the row-wise K-quant products' inputs; a
    function of its own, so a parallel loop does not take its stores for reductions)."""
    bsums = np.empty(X.shape[1] // 16, np.int16)
    for n in range(lo, hi):
        k_quant_dot.quantize_into(X[n], inputs.xq[n], inputs.xd[n], bsums)
        for g in range(bsums.size):
            inputs.xs16[n, g] = inputs.xd[n, g // 16] * np.float32(bsums[g])
        for b in range(bsums.size // 2):
            inputs.xs32[n, b] = inputs.xd[n, b // 8] * np.float32(np.int32(bsums[2 * b]) + np.int32(bsums[2 * b + 1]))


@njit(parallel=True, **KERNEL)
def _quantize_parallel(X, inputs, chunks):
    m = X.shape[0]
    for c in prange(chunks):
        _quantize_rows(X, inputs, c * m // chunks, (c + 1) * m // chunks)


# from this many rows, quantizing the inputs pays for a parallel launch
_PARALLEL_ROWS = 64


@njit(**KERNEL)
def quantize(X, threads):
    """The Inputs of the rows of X [m, cols] (float32, cols a multiple of 256)."""
    m, cols = X.shape
    inputs = Inputs(np.empty((m, cols), np.int8), np.empty((m, cols // 256), np.float32),
                    np.empty((m, cols // 32), np.float32), np.empty((m, cols // 16), np.float32))
    if threads > 1 and m >= _PARALLEL_ROWS:
        _quantize_parallel(X, inputs, threads)
    else:
        _quantize_rows(X, inputs, 0, m)
    return inputs


@njit(**KERNEL, inline="always")
def input_rows(inputs, lo, hi):
    """Rows [lo, hi) of inputs (views)."""
    return Inputs(inputs.xq[lo:hi], inputs.xd[lo:hi], inputs.xs32[lo:hi], inputs.xs16[lo:hi])


# --- a tile's float scales from the lanes' unpacked scale entries ----------------------------------------


def _make_scales(qtype):
    """scales(entries, d, dmin, s, neg_o): the float scales of a tile from the lanes' unpacked entries
    (k_quant_lanes.make_unpack), per block of the format's scale and lane, as vectors. Q4_K, per 32-weight
    sub-block j of super-block b: s = d * scale (the entries 0-7), neg_o = -(dmin * min) (the mins in int16
    pairs in entries 8-11); Q6_K, per 16-weight group g: s = d * scale (an int8 in the entry's low int16),
    neg_o = -32 s (its values are stored plus 32)."""
    per_block = 8 if qtype == qb.Q4_K else 16  # scales a super-block

    @intrinsic
    def scales(typingctx, entries, d, dmin, s, neg_o):
        def codegen(context, builder, sig, args):
            e_a, d_a, dmin_a, s_a, o_a = (context.make_array(t)(context, builder, v) for t, v in zip(sig.args, args))
            n_entries = cgutils.unpack_tuple(builder, e_a.shape, 3)[1]
            entry_vectors = builder.bitcast(e_a.data, _IVEC.as_pointer())

            def vectors(array, vtype):
                return builder.bitcast(array.data, vtype.as_pointer())

            def c(v):
                return ir.Constant(_I64, v)

            def lanes(v):
                return ir.Constant(_IVEC, [v] * ROWS)

            def entry(b, e):
                return builder.load(builder.gep(entry_vectors, [builder.add(builder.mul(b, n_entries), c(e))]), align=4)

            blocks = cgutils.unpack_tuple(builder, d_a.shape, 2)[0]
            with cgutils.for_range(builder, blocks) as loop:
                b = loop.index
                d = builder.load(builder.gep(vectors(d_a, _FVEC), [b]), align=4)
                dmin = builder.load(builder.gep(vectors(dmin_a, _FVEC), [b]), align=4)
                for j in range(per_block):
                    if qtype == qb.Q4_K:
                        scale = entry(b, j)
                        low_min = builder.and_(builder.lshr(entry(b, 8 + j // 2), lanes(16 * (j & 1))), lanes(0xFFFF))
                        s = builder.fmul(d, builder.sitofp(scale, _FVEC))
                        o = builder.fneg(builder.fmul(dmin, builder.sitofp(low_min, _FVEC)))
                    else:
                        scale = builder.sext(builder.trunc(entry(b, j), ir.VectorType(ir.IntType(16), ROWS)), _IVEC)
                        s = builder.fmul(d, builder.sitofp(scale, _FVEC))
                        o = builder.fmul(ir.Constant(_FVEC, [-32.0] * ROWS), s)
                    at = builder.add(builder.mul(b, c(per_block)), c(j))
                    builder.store(s, builder.gep(vectors(s_a, _FVEC), [at]), align=4)
                    builder.store(o, builder.gep(vectors(o_a, _FVEC), [at]), align=4)
            return context.get_dummy_value()

        return types.none(entries, d, dmin, s, neg_o), codegen

    return scales


_SCALES = {qtype: _make_scales(qtype) for qtype in _BLOCK}


# --- the micro-kernel: a tile of 16 weight rows times up to four input rows, in LLVM IR ---------------


def _halves(builder, v, n):
    """<2n x T> -> its two halves, <n x T> each."""
    return [builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(h * n, h * n + n))))
            for h in (0, 1)]


def _block_sum(builder, weights, inputs, int16_quads):
    """Per lane (weight row), the int32 sum of its four-value quads in `weights` (<16 x i32>, four uint8 each)
    times the input quads broadcast in `inputs` (int8): one `vpdpbusd` a quad with VNNI; else pmaddubsw's
    int16 pairs, `int16_quads` of them added before pmaddwd widens them (on 256-bit halves with AVX2)."""
    if _VNNI:
        total = ir.Constant(_IVEC, None)
        for w, x in zip(weights, inputs):
            total = _call(builder, "llvm.x86.avx512.vpdpbusd.512", _IVEC, [total, w, x])
        return total
    width = 64 if _AVX512 else 32  # bytes in a vector
    parts = 64 // width
    i8, i16, i32 = (ir.VectorType(t, width // k) for t, k in ((ir.IntType(8), 1), (ir.IntType(16), 2), (_I32, 4)))
    maddubs = "llvm.x86.avx512.pmaddubs.w.512" if _AVX512 else "llvm.x86.avx2.pmadd.ub.sw"
    maddwd = "llvm.x86.avx512.pmaddw.d.512" if _AVX512 else "llvm.x86.avx2.pmadd.wd"
    ones = ir.Constant(i16, [1] * (width // 2))

    def split(v):  # a <16 x i32> as `parts` vectors of `width` bytes
        return [builder.bitcast(h, i8) for h in (_halves(builder, v, 8) if parts == 2 else [v])]

    totals = [ir.Constant(i32, None)] * parts
    for first in range(0, len(weights), int16_quads):
        pairs = [None] * parts
        for w, x in zip(weights[first:first + int16_quads], inputs[first:first + int16_quads]):
            for p, (wp, xp) in enumerate(zip(split(w), split(x))):
                dot = _call(builder, maddubs, i16, [wp, xp])
                pairs[p] = dot if pairs[p] is None else builder.add(pairs[p], dot)
        totals = [builder.add(t, _call(builder, maddwd, i32, [pr, ones])) for t, pr in zip(totals, pairs)]
    if parts == 1:
        return totals[0]
    return builder.shuffle_vector(totals[0], totals[1], ir.Constant(ir.VectorType(_I32, 16), list(range(16))))


def _make_tile_kernel(n_rows, block, int16_quads):
    """tile(packed, s, neg_o, xq, xd, xs, r0, out, col0): out[r0 + i, col0 : col0 + 16] for i < n_rows: the
    products of the unpacked tile (packed [super-blocks, 64, 16, 4] uint8, s and neg_o [blocks, 16] float32
    per block of `block` weights) with input rows r0 + i (xq [m, cols] int8, xd [m, cols / 256], xs
    [m, cols / block])."""
    quads = block // 4

    @intrinsic
    def tile(typingctx, packed, s, neg_o, xq, xd, xs, r0, out, col0):
        def codegen(context, builder, sig, args):
            packed_a, s_a, o_a, xq_a, xd_a, xs_a = (context.make_array(sig.args[i])(context, builder, args[i])
                                                    for i in range(6))
            out_a = context.make_array(sig.args[7])(context, builder, args[7])
            r0_v, col0_v = args[6], args[8]

            def c(v):
                return ir.Constant(_I64, v)

            def row_width(array):
                return cgutils.unpack_tuple(builder, array.shape, 2)[1]

            def lanes_at(array, b):
                return builder.load(builder.bitcast(builder.gep(array.data, [builder.mul(b, c(ROWS))]),
                                                    _FVEC.as_pointer()), align=4)

            blocks = cgutils.unpack_tuple(builder, s_a.shape, 2)[0]
            tile_v = builder.bitcast(packed_a.data, _IVEC.as_pointer())
            rows = [builder.add(r0_v, c(i)) for i in range(n_rows)]
            x4_rows = [builder.bitcast(builder.gep(xq_a.data, [builder.mul(r, row_width(xq_a))]), _I32.as_pointer())
                       for r in rows]
            xd_rows = [builder.gep(xd_a.data, [builder.mul(r, row_width(xd_a))]) for r in rows]
            xs_rows = [builder.gep(xs_a.data, [builder.mul(r, row_width(xs_a))]) for r in rows]
            accs = [cgutils.alloca_once_value(builder, ir.Constant(_FVEC, None)) for _ in rows]

            with cgutils.for_range(builder, blocks) as loop:
                b = loop.index
                # quad q of the weight: its columns 4q .. 4q + 3, four bytes of each row
                at = [builder.add(builder.mul(b, c(quads)), c(k)) for k in range(quads)]
                weights = [builder.load(builder.gep(tile_v, [q]), align=4) for q in at]
                isums = [_block_sum(builder, weights, [_splat(builder, builder.load(builder.gep(x4, [q]), align=1),
                                                              ROWS) for q in at], int16_quads)
                         for x4 in x4_rows]
                scale, neg_offset = lanes_at(s_a, b), lanes_at(o_a, b)
                at256 = builder.udiv(builder.mul(b, c(block)), c(256))  # the input's block of 256 holding b
                for i in range(n_rows):
                    xd_b = _splat(builder, builder.load(builder.gep(xd_rows[i], [at256])), ROWS)
                    xs_b = _splat(builder, builder.load(builder.gep(xs_rows[i], [b])), ROWS)
                    acc = multiply_add(builder, builder.fmul(builder.sitofp(isums[i], _FVEC), scale), xd_b,
                                       builder.load(accs[i]))
                    builder.store(multiply_add(builder, neg_offset, xs_b, acc), accs[i])
            for i, r in enumerate(rows):
                _store_rows(context, builder, out_a, sig.args[7], r, col0_v, builder.load(accs[i]))
            return context.get_dummy_value()

        return types.none(packed, s, neg_o, xq, xd, xs, r0, out, col0), codegen

    return tile


def _product_of(qtype):
    """product(w, inputs, Y): Y [m, rows] = the products of every weight row of w (a format in _BLOCK) with
    every input row, 16 weight rows at a time (the last group may be short)."""
    unpack, scales = k_quant_lanes.make_unpack(qtype), _SCALES[qtype]
    n_entries, block = k_quant_lanes.FORMATS[qtype][2], _BLOCK[qtype]
    over_input_rows = int_gemm.over_input_rows(*(_make_tile_kernel(n, block, _INT16_QUADS[qtype])
                                                 for n in (4, 3, 2, 1)))
    halves = block == 16

    def product(w, inputs, Y):
        xq, xd = inputs.xq, inputs.xd
        xs = inputs.xs16 if halves else inputs.xs32
        m, cols = xq.shape
        packed = np.empty((cols // 256, 64, ROWS, 4), np.uint8)
        entries = np.empty((cols // 256, n_entries, ROWS), np.int32)
        d = np.empty((cols // 256, ROWS), np.float32)
        dmin = np.empty((cols // 256, ROWS), np.float32)
        s = np.empty((cols // block, ROWS), np.float32)
        neg_o = np.empty((cols // block, ROWS), np.float32)
        for r0 in range(0, w.shape[0], ROWS):
            unpack(w, r0, packed, entries, d, dmin)
            scales(entries, d, dmin, s, neg_o)
            over_input_rows(m, packed, s, neg_o, xq, xd, xs, Y, r0)
    return njit(inline="always")(product)


# product(formats, qtype, w, inputs, Y) for the formats in _BLOCK
product = switch({qtype: _product_of(qtype) for qtype in _BLOCK}, ("w", "inputs", "Y"))


@njit(parallel=True, **KERNEL)
def _gemm(formats, qtype, w, inputs, Y, chunks):
    """Y = w's rows times the input rows, the weight's tiles of 16 rows split into `chunks` runs."""
    tiles = (w.shape[0] + ROWS - 1) // ROWS
    for c in prange(chunks):
        r0, r1 = c * tiles // chunks * ROWS, min(w.shape[0], (c + 1) * tiles // chunks * ROWS)
        if r0 < r1:
            product(formats, qtype, w[r0:r1], inputs, Y[:, r0:r1])


def matmul_into(qtype: int, w: np.ndarray, X: np.ndarray, Y: np.ndarray, threads: int) -> None:
    """Y [m, rows] = X [m, cols] @ W.T for a weight `supports` accepts (X float32, C-contiguous), over
    `threads` threads."""
    inputs = quantize(X, threads)
    _gemm(formats.of([qtype]), qtype, w, inputs, Y, max(1, min(threads, (w.shape[0] + ROWS - 1) // ROWS)))
