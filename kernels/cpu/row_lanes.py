"""Row-wise products of several input rows with 16 weight rows side by side in vector lanes.

int8_dot's row kernels run one weight row at a time: each block's integer dot has its partial sums in
vector lanes and is scaled and accumulated per row, and its weights are unpacked again for every tile of
four input rows. With the 16 or so rows of a verify step, that bookkeeping, not the multiplies, is the
cost. Here a group of 16 weight rows is unpacked once into a tile (int_gemm's unpackers, four values of
each row side by side), and every input row passes over it: one `vpdpbusd` gives, for 16 weight rows at
once, the sum of four products that is one lane of the row kernel's dot, so the float arithmetic that
follows is the row kernel's own, lane for lane (for the 32-weight formats: the same partial sums, scaled and
fused-multiply-added in the same order, the two chains of even and odd blocks, the same final sums). A
row's outputs are the bits of int8_dot's (tested bitwise), so quant_dot takes the lanes by speed alone:
on hosts with them (AVAILABLE), for the FORMATS here, from MIN_INPUT_ROWS input rows.

The formats that unpack: Q4_0 and Q5_0 (their values enter unsigned, q = w + C, and C times the sum of the
four inputs comes off each integer sum, which is then exactly the row kernel's), Q4_1 and Q5_1 (unsigned
values, the mins through each block's input sum as the row kernel adds them). Q8_0's row kernel unpacks
nothing and was as fast as the lanes at 8 and 16 rows, so it keeps it; Q4_K's and Q6_K's (k_quant_dot) keep
their sub-block sums in integers, a float multiply-add per super-block, so they have no lanes yet.
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from kernels.common import quant_blocks as qb
from kernels.common.cpu_target import has
from kernels.cpu import int_gemm
from kernels.cpu.int8_dot import _call, multiply_add
from kernels.cpu.int_gemm import _splat

ROWS = 16        # weight rows per tile: one int32 lane each in a 512-bit vector
_QUADS = 8       # groups of four values per block of 32
# fewer input rows than this stay on int8_dot's kernels: the tile's unpacking must pay for itself (at 4 rows the row
# kernels read each weight once, in one pass of their four-row tile; measured on Qwen2.5 from 5 rows up)
MIN_INPUT_ROWS = 5

# format -> (bytes per block, blocks of 32 weights in it)
FORMATS = {qb.Q4_0: (18, 1), qb.Q5_0: (22, 1), qb.Q4_1: (20, 1), qb.Q5_1: (24, 1)}
# where the f16 scale d and the second f16 (a min; None: no such) sit in a format block
_SCALE_FIELDS = {qb.Q4_0: (0, None), qb.Q5_0: (0, None), qb.Q4_1: (0, 2), qb.Q5_1: (0, 2)}
# the 32-weight formats' C, the offset taken off their unsigned values (None: a mins format)
_CENTER = {qb.Q4_0: 8, qb.Q5_0: 16, qb.Q4_1: None, qb.Q5_1: None}

_I32 = ir.IntType(32)
_F32 = ir.FloatType()
_IVEC, _FVEC = ir.VectorType(_I32, ROWS), ir.VectorType(_F32, ROWS)


# this host has the lanes, AVX-512 VNNI (else int8_dot's kernels do all the products)
AVAILABLE = has("avx512bw") and has("avx512vnni")


def _row_of(builder, array, n, width):
    """The address of row n of a C-contiguous 2-d array argument with rows `width` elements long."""
    return builder.gep(array.data, [builder.mul(n, width)])


def _quad_dot(builder, tile, xq_row, b, k, acc):
    """acc + the tile's 16 rows' dots of their four values of group k of block b with the input row's four
    values there (xq_row: int8), one `vpdpbusd` (unsigned weights times signed inputs, summed in int32)."""
    i64 = b.type
    w = builder.load(builder.gep(tile, [builder.add(builder.mul(b, ir.Constant(i64, _QUADS)), ir.Constant(i64, k))]),
                     align=4)
    x = builder.gep(xq_row, [builder.add(builder.mul(b, ir.Constant(i64, 32)), ir.Constant(i64, 4 * k))])
    x4 = _splat(builder, builder.load(builder.bitcast(x, _I32.as_pointer()), align=1), ROWS)
    vnni = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_IVEC, [_IVEC] * 3),
                                          "llvm.x86.avx512.vpdpbusd.512")
    return builder.call(vnni, [acc, w, x4])


def kernel_arguments(context, builder, sig, args):
    """A lanes kernel's arguments (..., n, out, col0 at 7, 8 and 9): its arrays by position, n and col0."""
    arrays = {i: context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 1, 2, 3, 4, 5, 6, 8)}
    return arrays, args[7], args[9]


def tile_rows(builder, w_a, r0):
    """Pointers to weight rows r0 .. r0 + 15 of w_a (a 2-d uint8 array); past its last row (a last group of
    fewer than 16), that row again."""
    n_rows, row_bytes = cgutils.unpack_tuple(builder, w_a.shape, 2)
    last = builder.sub(n_rows, ir.Constant(r0.type, 1))
    rows = []
    for r in range(ROWS):
        row = builder.add(r0, ir.Constant(r0.type, r))
        row = builder.select(builder.icmp_signed(">", row, last), last, row)
        rows.append(builder.gep(w_a.data, [builder.mul(row, row_bytes)]))
    return rows


def _make_kernel(center):
    """rows(packed, d, dmin, xq, xd, xsum, xs4, n, out, col0): out[n, col0 : col0 + 16] = the dots of the
    tile's 16 weight rows with input row n (xq [m, cols] int8, xd [m, blocks] float32, xsum [m, blocks] and
    xs4 [m, blocks, 8] int32 the sums of each block's and each group of four's values), for a format whose
    unsigned values are w + center, or with center None, whose mins dmin come through xsum."""

    @intrinsic
    def rows(typingctx, packed, d, dmin, xq, xd, xsum, xs4, n, out, col0):
        def codegen(context, builder, sig, args):
            a, n_v, col0_v = kernel_arguments(context, builder, sig, args)
            i64 = n_v.type
            c = lambda v: ir.Constant(i64, v)  # noqa: E731
            blocks = cgutils.unpack_tuple(builder, a[0].shape, 4)[0]
            cols = cgutils.unpack_tuple(builder, a[3].shape, 2)[1]
            tile = builder.bitcast(a[0].data, _IVEC.as_pointer())
            xq_row, xd_row, xsum_row = _row_of(builder, a[3], n_v, cols), _row_of(builder, a[4], n_v, blocks), \
                _row_of(builder, a[5], n_v, blocks)
            xs4_row = _row_of(builder, a[6], n_v, builder.mul(blocks, c(_QUADS)))
            chains = [[cgutils.alloca_once_value(builder, ir.Constant(_FVEC, None)) for _ in range(_QUADS)]
                      for _ in range(2)]
            offsets = [cgutils.alloca_once_value(builder, ir.Constant(_FVEC, None)) for _ in range(2)]

            def vector_at(ptr, index):
                return builder.load(builder.bitcast(builder.gep(ptr, [index]), _FVEC.as_pointer()), align=4)

            def block(b, chain):
                xd_b = builder.load(builder.gep(xd_row, [b]))
                scale = builder.fmul(vector_at(a[1].data, builder.mul(b, c(ROWS))), _splat(builder, xd_b, ROWS))
                for k in range(_QUADS):
                    dots = _quad_dot(builder, tile, xq_row, b, k, ir.Constant(_IVEC, None))
                    if center is not None:
                        x_sum = builder.load(builder.gep(xs4_row, [builder.add(builder.mul(b, c(_QUADS)), c(k))]))
                        dots = builder.sub(dots, _splat(builder, builder.mul(x_sum, ir.Constant(_I32, center)), ROWS))
                    acc = chains[chain][k]
                    builder.store(multiply_add(builder, builder.sitofp(dots, _FVEC), scale, builder.load(acc)), acc)
                if center is None:
                    mins = vector_at(a[2].data, builder.mul(b, c(ROWS)))
                    x_sum = builder.sitofp(builder.load(builder.gep(xsum_row, [b])), _F32)
                    term = builder.fmul(builder.fmul(mins, _splat(builder, xd_b, ROWS)), _splat(builder, x_sum, ROWS))
                    builder.store(builder.fadd(builder.load(offsets[chain]), term), offsets[chain])

            with cgutils.for_range(builder, builder.lshr(blocks, c(1))) as loop:
                b = builder.shl(loop.index, c(1))
                block(b, 0)
                block(builder.add(b, c(1)), 1)
            with builder.if_then(builder.trunc(blocks, ir.IntType(1))):
                block(builder.sub(blocks, c(1)), 0)
            # the row kernel's ending: lane k of the two chains added, the eight lanes summed in order, the
            # offsets' two chains after
            total = ir.Constant(_FVEC, None)
            for k in range(_QUADS):
                total = builder.fadd(total, builder.fadd(builder.load(chains[0][k]), builder.load(chains[1][k])))
            total = builder.fadd(total, builder.fadd(builder.load(offsets[0]), builder.load(offsets[1])))
            _store_rows(context, builder, a[8], sig.args[8], n_v, col0_v, total)
            return context.get_dummy_value()

        return types.none(packed, d, dmin, xq, xd, xsum, xs4, n, out, col0), codegen

    return rows


def _store_rows(context, builder, out_a, out_type, n, col0, values):
    """out[n, col0 : col0 + 16] = values (a <16 x float>), out a 2-d float32 array of any strides; past its
    last column (a weight's last rows, fewer than 16) the lanes are not stored."""
    shape = cgutils.unpack_tuple(builder, out_a.shape, 2)
    strides = cgutils.unpack_tuple(builder, out_a.strides, 2)
    dst = builder.bitcast(cgutils.get_item_pointer2(context, builder, out_a.data, shape, strides, out_type.layout,
                                                    [n, col0]), _FVEC.as_pointer())
    left = builder.sub(shape[1], col0)
    with builder.if_else(builder.icmp_signed(">=", left, ir.Constant(left.type, ROWS))) as (whole, part):
        with whole:
            builder.store(values, dst, align=4)
        with part:
            lanes = ir.Constant(_IVEC, list(range(ROWS)))
            mask = builder.icmp_signed("<", lanes, _splat(builder, builder.trunc(left, _I32), ROWS))
            _call(builder, "llvm.masked.store.v16f32.p0v16f32", ir.VoidType(),
                  [values, dst, ir.Constant(_I32, 4), mask])


def transpose_rows(builder, rows):
    """ROWS vectors of n int32, one per weight row -> n vectors of ROWS lanes: vector i holds every row's
    element i, row r's in lane r. In squares of ROWS elements (the last one padded), each transposed by
    swapping the off-diagonal k x k blocks of every 2k x 2k block, k = 8, 4, 2, 1: 4 x 16 two-vector shuffles.
    (As one shuffle out of all the vectors, LLVM built each output from a tree of them: the unpacking of a
    Q4_K tile took twice as long.)"""
    n = rows[0].type.count
    out = []
    for first in range(0, n, ROWS):  # elements first .. first + ROWS - 1 of every row, past n undefined
        picks = ir.Constant(_IVEC, [min(i, n - 1) for i in range(first, first + ROWS)])
        square = [builder.shuffle_vector(row, row, picks) for row in rows]
        out += _transpose_square(builder, square)[:min(ROWS, n - first)]
    return out


def _transpose_square(builder, rows):
    k = ROWS // 2
    while k:
        groups = range(0, ROWS, 2 * k)
        # lanes of each 2k group: its first k of vector a then of b (top), or its second k of each (bottom)
        top = [x for g in groups for x in [*range(g, g + k), *range(ROWS + g, ROWS + g + k)]]
        bottom = [x + k for x in top]
        for i in (i for i in range(ROWS) if not i & k):
            a, b = rows[i], rows[i + k]
            rows[i] = builder.shuffle_vector(a, b, ir.Constant(_IVEC, top))
            rows[i + k] = builder.shuffle_vector(a, b, ir.Constant(_IVEC, bottom))
        k //= 2
    return rows


def _make_unpack(qtype):
    """unpack(w, r0, packed, d, dmin): weight rows r0 .. r0 + 15 of w [rows, row bytes] into the tile: their
    unsigned values, block b's group k of four of every row side by side in packed[b, k] ([blocks of 32, 8,
    16, 4] uint8), and per block of 32 the f16 scales of the 16 rows' format block: d[b] and (the mins
    formats) dmin[b]. A block of the 16 rows is unpacked as int_gemm's unpackers do one, then
    transposed in registers."""
    block_bytes, per_block = FORMATS[qtype]
    values = _VALUES[qtype]
    d_at, dmin_at = _SCALE_FIELDS[qtype]

    @intrinsic
    def unpack(typingctx, w, r0, packed, d, dmin):
        def codegen(context, builder, sig, args):
            w_a, packed_a, d_a, dmin_a = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 2, 3, 4))
            r0_v = args[1]
            c = lambda v: ir.Constant(r0_v.type, v)  # noqa: E731
            row_bytes = cgutils.unpack_tuple(builder, w_a.shape, 2)[1]
            blocks = cgutils.unpack_tuple(builder, packed_a.shape, 4)[0]
            rows = tile_rows(builder, w_a, r0_v)
            tile = builder.bitcast(packed_a.data, _IVEC.as_pointer())
            ahead = builder.mul(row_bytes, c(ROWS))
            half16 = ir.VectorType(ir.HalfType(), ROWS)
            with cgutils.for_range(builder, blocks) as loop:
                b = loop.index
                sub = builder.urem(b, c(per_block))
                ptrs = [builder.gep(row, [builder.mul(builder.udiv(b, c(per_block)), c(block_bytes))]) for row in rows]
                for p in ptrs:  # the next 16 rows' block: 16 streams are more than the hardware prefetcher follows
                    at = builder.add(ahead, builder.mul(sub, c(block_bytes // per_block)))
                    _call(builder, "llvm.prefetch.p0i8", ir.VoidType(), [builder.gep(p, [at]), ir.Constant(_I32, 0),
                                                                       ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
                # 16 rows of eight groups -> eight vectors of one group of 16 rows
                groups = transpose_rows(builder, [builder.bitcast(values(builder, p, sub), ir.VectorType(_I32, _QUADS))
                                                  for p in ptrs])
                for k, group in enumerate(groups):
                    builder.store(group, builder.gep(tile, [builder.add(builder.mul(b, c(_QUADS)), c(k))]), align=4)
                for field, array in ((d_at, d_a),) + (((dmin_at, dmin_a),) if dmin_at is not None else ()):
                    halves = ir.Constant(half16, None)
                    for r, p in enumerate(ptrs):
                        h = builder.load(builder.bitcast(builder.gep(p, [c(field)]), ir.HalfType().as_pointer()), align=1)
                        halves = builder.insert_element(halves, h, ir.Constant(_I32, r))
                    dst = builder.bitcast(builder.gep(array.data, [builder.mul(b, c(ROWS))]), _FVEC.as_pointer())
                    builder.store(builder.fpext(halves, _FVEC), dst, align=4)
            return context.get_dummy_value()

        return types.none(w, r0, packed, d, dmin), codegen

    return unpack


_VALUES = {qb.Q4_0: int_gemm._block_values(2), qb.Q5_0: int_gemm._block_values(6, 2),
           qb.Q4_1: int_gemm._block_values(4), qb.Q5_1: int_gemm._block_values(8, 4)}
_KERNELS = {center: _make_kernel(center) for center in _CENTER.values()}


def products_of(qtype):
    """products(w, act, Y) for a format in FORMATS: Y = the products of every weight row of w with every
    input row (act: kernels.cpu.quant_dot.Activations: xq, xd, xsum as int8_dot.quantize gives them, per row,
    and xs4 [m, blocks * 8] the sums of each group of four values), 16 weight rows at a time (the last group
    may be short)."""
    unpack = _make_unpack(qtype)
    kernel = _KERNELS[_CENTER[qtype]]

    def products(w, act, Y):
        xq, xd, xsum, xs4 = act.xq, act.xd, act.xsum, act.xs4
        m, blocks = xd.shape
        packed = np.empty((blocks, _QUADS, ROWS, 4), np.uint8)
        d = np.empty((blocks, ROWS), np.float32)
        dmin = np.empty((blocks, ROWS), np.float32)
        for r0 in range(0, w.shape[0], ROWS):
            unpack(w, r0, packed, d, dmin)
            for n in range(m):
                kernel(packed, d, dmin, xq, xd, xsum, xs4, n, Y, r0)
    return njit(inline="always")(products)
