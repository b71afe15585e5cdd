"""Fused block-reading dot products: out[n, r] = sum_c W[r, c] * X[n, c] for every row r of w and n of X.

`activations(X)` derives what the kernels read besides the weights from the input rows once per product.
Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/MXFP4 multiply their quants with x quantized to int8 blocks of 32, Q4_K/Q6_K with x in
int8 blocks of 256 (as llama.cpp does: its Q8_0 and Q8_K), one integer dot per block (int8_dot,
k_quant_dot); the other formats widen
each block's quants to float and multiply with x in registers. Either way the
block sum is scaled once and offsets (the mins, Q3_K's -4, ...) are folded in
through block sums of x (Q4_0's, Q5_0's and Q6_K's come off the weights in int8),
so the inner loops stay plain multiply-adds.
Layouts and the vectorization idioms (`n16`, `idx`, `bits`, `join`) are
described in quant_blocks.

The int8 formats take all input rows at once (`dot_<format>(w, xq, xd, xsum, out)`: each weight
block is unpacked once for a tile of input rows, see int8_dot._tiled); the float ones
(`dot_<format>(w, x, xs, out, n16)`) take one input row per call. Either way row n's outputs are the
bits of a one-row product.

`products` multiplies one or several stacked weights by one or more input rows,
reading each weight tile once for all rows and splitting the rows over threads. Entry points live next to the kernels
they inline because Numba's on-disk cache only notices edits to the file that
defines a function (after editing quant_blocks' helpers, int8_dot or f16.py,
delete the `__pycache__/*.nb*` files).
"""

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from kernels.common.formats import ByLanes, switch
from kernels.common.quant_blocks import (
    BF16, F16, F32, KERNEL, KERNEL_ONCE, MXFP4, N16, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0,
    bits, idx, join, k_scale_min, load_f16, q3_k_scale, span,
)
from kernels.cpu import float_dot, int8_dot, k_quant_dot, k_quant_lanes, row_lanes
from kernels.cpu.int8_dot import (
    rows_dot_mxfp4, rows_dot_q4_0, rows_dot_q4_1, rows_dot_q5_0, rows_dot_q5_1, rows_dot_q8_0,
)
from kernels.cpu.k_quant_dot import rows_dot_q4_k, rows_dot_q6_k

# smaller weights run on the calling thread: a parallel launch costs more than it saves
PARALLEL_MIN_BYTES = 1 << 17

# float32 constants: an int literal would turn the float32 block arithmetic into float64
_4, _8, _16, _32 = np.float32(4), np.float32(8), np.float32(16), np.float32(32)


@njit(**KERNEL)
def _sum32(xs, e):
    """Sum of x over the 32 elements starting at e."""
    return xs[e >> 4] + xs[(e >> 4) + 1]


# --- the order of a product's weight rows -------------------------------------


@njit(**KERNEL_ONCE)
def stream_row(n, i):
    """The weight row a product of n rows computes i-th: rows r and half + r in turn, two interleaved streams.
    Each is a sequential read the hardware prefetcher follows, so twice as many lines come in flight while
    the arithmetic of the rows in hand runs (a one-row Q4_K product over 3 GB of mapped experts on 2 threads:
    21 -> 26 GB/s, the page cache's ceiling here; more streams, no better). Rows are independent: the order
    changes no row's bits."""
    half = (n + 1) // 2
    return i // 2 if i % 2 == 0 else half + i // 2


# --- float formats ----------------------------------------------------------


# F32 and F16 rows in float_dot's fixed order of vector lanes: a one-lane chain of adds (the source order,
# which LLVM may not vectorize) read a MoE router's F32 rows at a quarter of the Q4_K kernels' rate
@njit(**KERNEL_ONCE)
def dot_f32(w, x, xs, out, n16):
    for i in range(w.shape[0]):
        r = stream_row(w.shape[0], i)
        out[r] = float_dot.dot(x, w[r].view(np.float32))


@njit(**KERNEL_ONCE)
def dot_f16(w, x, xs, out, n16):
    for i in range(w.shape[0]):
        r = stream_row(w.shape[0], i)
        out[r] = float_dot.dot(x, w[r].view(np.uint16))


@njit(**KERNEL_ONCE)
def dot_bf16(w, x, xs, out, n16):
    for r in range(w.shape[0]):
        row = w[r].view(np.uint16)
        acc = np.float32(0)
        for c in range(x.shape[0]):
            value = np.uint32(np.left_shift(np.uint32(row[idx(c)]), np.uint32(16)))  # the top half of an f32
            acc += value.view(np.float32) * x[idx(c)]
        out[r] = acc


# --- 32-weight blocks -------------------------------------------------------


def _in_streams(rows_dot):
    """dot(w, xq, xd, xsum, out): every weight row of w with an int8 format's rows_dot, in stream_row's order."""
    def dot(w, xq, xd, xsum, out):
        for i in range(w.shape[0]):
            rows_dot(w, stream_row(w.shape[0], i), xq, xd, xsum, out)
    return njit(inline="always")(dot)


dot_q4_0, dot_q4_1, dot_q5_0, dot_q5_1, dot_q8_0, dot_mxfp4 = (_in_streams(rows_dot) for rows_dot in (
    rows_dot_q4_0, rows_dot_q4_1, rows_dot_q5_0, rows_dot_q5_1, rows_dot_q8_0, rows_dot_mxfp4))


# --- K-quants ---------------------------------------------------------------
# Each inner loop reads one run of 16 bytes once and feeds the four 16-weight
# groups its bit fields belong to, each with its own scale.


@njit(**KERNEL_ONCE)
def dot_q2_k(w, x, xs, out, n16):
    for r in range(w.shape[0]):
        row = w[r]
        acc = np.float32(0)
        for b in range(row.shape[0] // 84):
            o, e = b * 84, b * 256
            d, dmin = load_f16(row, o + 80), load_f16(row, o + 82)
            for h in range(2):
                for k in range(2):
                    qo, eo = o + 16 + h * 32 + k * 16, e + h * 128 + k * 16
                    t0 = t1 = t2 = t3 = np.float32(0)
                    for l in range(span(n16, 16)):
                        q = row[idx(qo + l)]
                        t0 += np.float32(bits(q, 0, 3)) * x[idx(eo + l)]
                        t1 += np.float32(bits(q, 2, 3)) * x[idx(eo + 32 + l)]
                        t2 += np.float32(bits(q, 4, 3)) * x[idx(eo + 64 + l)]
                        t3 += np.float32(bits(q, 6, 3)) * x[idx(eo + 96 + l)]
                    so, g = o + h * 8 + k, eo >> 4
                    s0, s1, s2, s3 = row[so], row[so + 2], row[so + 4], row[so + 6]
                    acc += d * (
                        np.float32(s0 & 15) * t0
                        + np.float32(s1 & 15) * t1
                        + np.float32(s2 & 15) * t2
                        + np.float32(s3 & 15) * t3
                    ) - dmin * (
                        np.float32(s0 >> 4) * xs[g]
                        + np.float32(s1 >> 4) * xs[g + 2]
                        + np.float32(s2 >> 4) * xs[g + 4]
                        + np.float32(s3 >> 4) * xs[g + 6]
                    )
        out[r] = acc


@njit(**KERNEL_ONCE)
def dot_q3_k(w, x, xs, out, n16):
    for r in range(w.shape[0]):
        row = w[r]
        acc = np.float32(0)
        for b in range(row.shape[0] // 110):
            o, e = b * 110, b * 256
            d = load_f16(row, o + 108)
            for h in range(2):
                for k in range(2):
                    mo, qo, eo = o + k * 16, o + 32 + h * 32 + k * 16, e + h * 128 + k * 16
                    t0 = t1 = t2 = t3 = np.float32(0)
                    for l in range(span(n16, 16)):
                        # the weight + 4: low bits from qs, bit 2 from the mask
                        q, m = row[idx(qo + l)], row[idx(mo + l)]
                        t0 += np.float32(join(bits(q, 0, 3), bits(m, 4 * h, 1), 2)) * x[idx(eo + l)]
                        t1 += np.float32(join(bits(q, 2, 3), bits(m, 4 * h + 1, 1), 2)) * x[idx(eo + 32 + l)]
                        t2 += np.float32(join(bits(q, 4, 3), bits(m, 4 * h + 2, 1), 2)) * x[idx(eo + 64 + l)]
                        t3 += np.float32(join(bits(q, 6, 3), bits(m, 4 * h + 3, 1), 2)) * x[idx(eo + 96 + l)]
                    so, gs, g = o + 96, h * 8 + k, eo >> 4
                    acc += d * (
                        q3_k_scale(row, so, gs) * (t0 - _4 * xs[g])
                        + q3_k_scale(row, so, gs + 2) * (t1 - _4 * xs[g + 2])
                        + q3_k_scale(row, so, gs + 4) * (t2 - _4 * xs[g + 4])
                        + q3_k_scale(row, so, gs + 6) * (t3 - _4 * xs[g + 6])
                    )
        out[r] = acc


dot_q4_k = _in_streams(rows_dot_q4_k)  # activations in blocks of 256 (k_quant_dot)


@njit(**KERNEL_ONCE)
def dot_q5_k(w, x, xs, out, n16):
    for r in range(w.shape[0]):
        row = w[r]
        acc = np.float32(0)
        for b in range(row.shape[0] // 176):
            o, e = b * 176, b * 256
            d, dmin = load_f16(row, o), load_f16(row, o + 2)
            for c in range(4):
                qo, eo = o + 48 + 32 * c, e + 64 * c
                lo = hi = np.float32(0)
                for l in range(span(n16, 32)):
                    q, hb = row[idx(qo + l)], row[idx(o + 16 + l)]
                    lo += np.float32(join(bits(q, 0, 15), bits(hb, 2 * c, 1), 4)) * x[idx(eo + l)]
                    hi += np.float32(join(bits(q, 4, 15), bits(hb, 2 * c + 1, 1), 4)) * x[idx(eo + 32 + l)]
                sc1, m1 = k_scale_min(row, o + 4, 2 * c)
                sc2, m2 = k_scale_min(row, o + 4, 2 * c + 1)
                acc += d * (sc1 * lo + sc2 * hi) - dmin * (m1 * _sum32(xs, eo) + m2 * _sum32(xs, eo + 32))
        out[r] = acc


dot_q6_k = _in_streams(rows_dot_q6_k)


# --- entry points -----------------------------------------------------------


def _all_rows(dot, qtype):
    """A 32-weight int8 format's product: every input row at once (each weight block unpacked once for
    several); for format sets with the lanes, from row_lanes.MIN_INPUT_ROWS rows in groups of 16 in vector
    lanes where the host and the format have them (the same bits)."""
    def product(w, X, act, Y, n16):
        dot(w, act.xq, act.xd, act.xsum, Y)
    plain = njit(inline="always")(product)
    if not (row_lanes.AVAILABLE and qtype in row_lanes.FORMATS):
        return plain
    return _by_lanes(plain, row_lanes.products_of(qtype), row_lanes.MIN_INPUT_ROWS)


def _super_block_rows(dot, qtype):
    """A K-quant's product against activations in blocks of 256: every input row at once; for format sets
    with the lanes, from k_quant_lanes.MIN_INPUT_ROWS rows in groups of 16 in vector lanes where the host
    has them (the same bits)."""
    def product(w, X, act, Y, n16):
        dot(w, act.kq, act.kd, act.kbsums, Y)
    plain = njit(inline="always")(product)
    if not row_lanes.AVAILABLE:
        return plain
    return _by_lanes(plain, k_quant_lanes.products_of(qtype), k_quant_lanes.MIN_INPUT_ROWS)


def _by_lanes(plain, lanes, min_rows):
    """plain(w, X, act, Y, n16) for format sets without the lanes; for sets with them, lanes(w, act, Y) from
    min_rows input rows."""
    def product_lanes(w, X, act, Y, n16):
        if X.shape[0] < min_rows:
            plain(w, X, act, Y, n16)
        else:
            lanes(w, act, Y)
    return ByLanes(plain, njit(inline="always")(product_lanes))


def _each_row(dot):
    """A float format's product: its kernel takes one input row."""
    def product(w, X, act, Y, n16):
        for n in range(X.shape[0]):
            dot(w, X[n], act.xs[n], Y[n], n16)
    return njit(inline="always")(product)


# product(formats, qtype, w, X, act, Y, n16): Y[n] = w times X[n] for every input row n, given
# act = activations(X, needs(qtypes))
_product = switch({
    Q4_K: _super_block_rows(dot_q4_k, Q4_K), Q6_K: _super_block_rows(dot_q6_k, Q6_K), Q8_0: _all_rows(dot_q8_0, Q8_0),
    Q5_0: _all_rows(dot_q5_0, Q5_0), Q4_0: _all_rows(dot_q4_0, Q4_0), Q4_1: _all_rows(dot_q4_1, Q4_1),
    Q5_1: _all_rows(dot_q5_1, Q5_1), MXFP4: _all_rows(dot_mxfp4, MXFP4), Q5_K: _each_row(dot_q5_k),
    Q3_K: _each_row(dot_q3_k), Q2_K: _each_row(dot_q2_k), F32: _each_row(dot_f32), F16: _each_row(dot_f16),
    BF16: _each_row(dot_bf16),
}, ("w", "X", "act", "Y", "n16"))


class Activations(NamedTuple):
    """What the kernels read besides the weights, per input row n (the kinds a product's formats do not read
    are empty)."""

    xs: np.ndarray      # float32 [m, cols / 16]: sums of X[n] over runs of 16 (the float kernels' offsets)
    xq: np.ndarray      # int8 [m, cols]: X[n] in blocks of 32 (int8_dot.quantize: values, scales, value sums)
    xd: np.ndarray
    xsum: np.ndarray
    xs4: np.ndarray     # int32 [m, cols / 4]: the sums of each four of xq (row_lanes, from its row count)
    kq: np.ndarray      # int8 [m, cols]: X[n] in blocks of 256 (k_quant_dot.quantize_into: values, scales,
    kd: np.ndarray      # sums of 16)
    kbsums: np.ndarray


# what a product's formats read: bit flags for `activations`
FLOAT_SUMS, BLOCKS_32, BLOCKS_256 = 1, 2, 4


@njit(**KERNEL)
def needs(qtypes):
    """The activation kinds the formats in qtypes read (FLOAT_SUMS | BLOCKS_32 | BLOCKS_256)."""
    need = 0
    for t in qtypes:
        if t == Q4_K or t == Q6_K:
            need |= BLOCKS_256
        elif t == Q4_0 or t == Q4_1 or t == Q5_0 or t == Q5_1 or t == Q8_0 or t == MXFP4:
            need |= BLOCKS_32
        else:
            need |= FLOAT_SUMS
    return need


@njit(inline="always")
def _sized(need, flag, n):
    return n if need & flag else 0


@njit(**KERNEL_ONCE)
def _empty_activations(m, cols, need):
    """Activations for m rows of `cols` values, of the kinds in `need` (the others empty)."""
    xs = np.empty((m, _sized(need, FLOAT_SUMS, cols // 16)), np.float32)
    xq = np.empty((m, _sized(need, BLOCKS_32, cols // 32 * 32)), np.int8)
    xd = np.empty((m, _sized(need, BLOCKS_32, cols // 32)), np.float32)
    xsum = np.empty((m, _sized(need, BLOCKS_32, cols // 32)), np.int32)
    lanes = row_lanes.AVAILABLE and m >= row_lanes.MIN_INPUT_ROWS
    xs4 = np.empty((m, _sized(need, BLOCKS_32, cols // 32 * 8) if lanes else 0), np.int32)
    kq = np.empty((m, _sized(need, BLOCKS_256, cols // 256 * 256)), np.int8)
    kd = np.empty((m, _sized(need, BLOCKS_256, cols // 256)), np.float32)
    kbsums = np.empty((m, _sized(need, BLOCKS_256, cols // 16)), np.int16)
    return Activations(xs, xq, xd, xsum, xs4, kq, kd, kbsums)


@njit(**KERNEL)
def _activate_row(X, act, n):
    """Row n of act from row n of X. (A function of its own, never inlined: in a parallel loop Numba would
    take the rows' stores for reductions of the whole arrays.)"""
    for g in range(act.xs.shape[1]):
        total = np.float32(0)
        for c in range(16):
            total += X[n, 16 * g + c]
        act.xs[n, g] = total
    if act.xq.shape[1]:
        int8_dot.quantize_into(X[n], act.xq[n], act.xd[n], act.xsum[n])
    for g in range(act.xs4.shape[1]):
        act.xs4[n, g] = np.int32(act.xq[n, 4 * g]) + np.int32(act.xq[n, 4 * g + 1]) \
            + np.int32(act.xq[n, 4 * g + 2]) + np.int32(act.xq[n, 4 * g + 3])
    if act.kq.shape[1]:
        k_quant_dot.quantize_into(X[n], act.kq[n], act.kd[n], act.kbsums[n])


@njit(**KERNEL)
def activations(X, need):
    """The Activations of the rows of X that formats with needs `need` read."""
    act = _empty_activations(X.shape[0], X.shape[1], need)
    for n in range(X.shape[0]):
        _activate_row(X, act, n)
    return act


@njit(parallel=True, **KERNEL)
def _activate_parallel(X, act, chunks):
    m = X.shape[0]
    for c in prange(chunks):
        for n in range(c * m // chunks, (c + 1) * m // chunks):
            _activate_row(X, act, n)


# from this many rows, computing the activations pays for a parallel launch (a prefill's thousands of MoE pairs)
_ACTIVATIONS_PARALLEL_ROWS = 64


@njit(**KERNEL)
def activations_split(X, need, threads):
    """activations(X, need), its rows split over `threads` where there are many (the same values)."""
    if threads > 1 and X.shape[0] >= _ACTIVATIONS_PARALLEL_ROWS:
        act = _empty_activations(X.shape[0], X.shape[1], need)
        _activate_parallel(X, act, threads)
        return act
    return activations(X, need)


# rows of a weight multiplied by every input row in turn: small enough to stay in L2 meanwhile
_ROW_TILE_BYTES = 64 << 10


@njit(**KERNEL)
def _dispatch(formats, qtype, w, X, act, Y, n16):
    # its own function, not inlined into the tile loop below: inlined there, the format bodies made
    # SmolLM2's decode layers 13% slower
    _product(formats, qtype, w, X, act, Y, n16)


@njit(**KERNEL)
def tiled_product(formats, qtype, w, X, act, Y):
    """Y = the products of the weight rows w (of GGML type qtype) with every row of X, given act =
    activations(X): each tile of weight rows is read once and multiplied by every input row while it stays
    in L2."""
    rows = w.shape[0]
    # one input row streams the weight straight through; more revisit each tile while it is in L2
    tile = rows if X.shape[0] == 1 else max(1, _ROW_TILE_BYTES // w.shape[1])
    if X.shape[0] >= row_lanes.MIN_INPUT_ROWS:  # whole groups of the lanes' rows
        tile = max(1, tile // row_lanes.ROWS) * row_lanes.ROWS
    for r0 in range(0, rows, tile):
        r1 = min(rows, r0 + tile)
        _dispatch(formats, qtype, w[r0:r1], X, act, Y[:, r0:r1], N16)


@njit(**KERNEL)
def _products_range(formats, qtypes, ws, starts, X, act, Y, lo, hi):
    """Stacked rows [lo, hi) of the weights in ws (weight i, of GGML type qtypes[i], owns columns
    starts[i]:starts[i+1] of Y) times every row of X, given act = activations(X)."""
    for i in range(len(ws)):
        a, b = max(lo, starts[i]), min(hi, starts[i + 1])
        if a < b:
            tiled_product(formats, qtypes[i], ws[i][a - starts[i] : b - starts[i]], X, act, Y[:, a:b])


@njit(parallel=True, **KERNEL)
def _products_parallel(formats, qtypes, ws, starts, X, act, Y, chunks):
    """_products_range over all the stacked rows, split into `chunks` equal row ranges."""
    total = starts[-1]
    for c in prange(chunks):
        _products_range(formats, qtypes, ws, starts, X, act, Y, c * total // chunks, (c + 1) * total // chunks)


@njit(**KERNEL)
def parallel_chunks(ws, threads):
    """How many threads a product over the weights ws should use: smaller weights stay on the
    calling thread, where a parallel launch would cost more than it saves."""
    nbytes = 0
    for i in range(len(ws)):
        nbytes += ws[i].size
    return threads if nbytes >= PARALLEL_MIN_BYTES else 1


# weights one product stacks: q, k and v at most. Fewer are padded with empty weights, so that every
# product has the same argument types and compiles once, not once per count
STACK = 3
_NO_WEIGHT = np.zeros((0, 1), np.uint8)
_NO_WEIGHT.flags.writeable = False  # the type of the weights' read-only views


def stack(qtypes, ws) -> tuple[np.ndarray, tuple]:
    """(qtypes, ws) as `products` takes them: GGML type ids as int64 and the weights, padded to STACK."""
    if not 1 <= len(ws) == len(qtypes) <= STACK:
        raise ValueError(f"a product stacks 1 to {STACK} weights with a type each, got {len(ws)} and {len(qtypes)}")
    padding = STACK - len(ws)
    return np.array([*qtypes, *[qtypes[0]] * padding], np.int64), (*ws, *[_NO_WEIGHT] * padding)


@njit(**KERNEL)
def products(formats, qtypes, ws, X, Y, chunks):
    """Y[n] = the stacked products of the weights in ws with X[n], for every row n of X (float32 [m, cols],
    C-contiguous; Y [m, total rows]), split over `chunks` threads. Row n's outputs are computed exactly as
    for X[n] alone (the same activations, the same dot, the same order), whatever m and the chunks.
    (qtypes, ws) come from `stack`; formats (kernels.common.formats) holds every type in qtypes."""
    starts = np.zeros(len(ws) + 1, np.int64)
    for i in range(len(ws)):
        starts[i + 1] = starts[i] + ws[i].shape[0]
    act = activations(X, needs(qtypes))
    if chunks > 1:
        _products_parallel(formats, qtypes, ws, starts, X, act, Y, chunks)
    else:  # all the rows, bounds as int64 (a literal 0 would compile another _products_range)
        _products_range(formats, qtypes, ws, starts, X, act, Y, starts[0], starts[-1])
