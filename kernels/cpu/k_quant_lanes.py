"""Q4_K and Q6_K products of several input rows with 16 weight rows side by side in vector lanes (row_lanes,
for the K-quants).

k_quant_dot's row kernels keep a super-block's dot in eight int32 lanes: lane l sums, over the super-block's
runs of 32 weights, each product of the four at positions 4l .. 4l + 3 of the run times its sub-block's scale
(Q4_K's 32-weight sub-blocks, Q6_K's 16-weight groups); then one float multiply-add per lane and super-block,
the mins (Q4_K) in four more lanes, and the lanes summed in llama.cpp's order. With the many rows of a verify
step or of a prefill's experts, unpacking each super-block again for every tile of input rows and the eight
instructions per 32 weights are the cost. Here a tile of 16 weight rows is unpacked once (four values of each
row side by side, the scales and mins as int32 lanes) and every input row passes over it: one `vpdpbusd`
gives, for the 16 rows, a four-product sum, and one `vpdpwssd` adds it times each row's scale to the lane it
belongs to (the sum fits int16: four products of a value below 64 and an input of magnitude at most 127, so a
scale in the low int16 of a lane, 0 in the high, multiplies it exactly). The integer lanes are the row
kernel's, and the float steps after them its own, lane for lane: a row's outputs are its bits (tested bitwise).
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from kernels.common import quant_blocks as qb
from kernels.cpu.int8_dot import _call, multiply_add
from kernels.cpu.int_gemm import _splat
from kernels.cpu.k_quant_dot import q4_k_scales_mins, q4_k_values, q6_k_values
from kernels.cpu.row_lanes import (
    _FVEC, _IVEC, ROWS, _quad_dot, _row_of, _store_rows, kernel_arguments, tile_rows, transpose_rows,
)

_I16, _I32 = ir.IntType(16), ir.IntType(32)
# fewer input rows than this stay on k_quant_dot's kernels: unpacking a tile costs about as much as the row
# kernels' work for a dozen rows (measured on an expert's Q4_K gate and Q6_K down: equal at 16 rows, the lanes
# 1.15x faster at 24, 1.3-1.45x at 64, a prefill's rows per expert)
MIN_INPUT_ROWS = 20
_QUADS = 64   # groups of four values per super-block of 256
_LANES = 8    # the row kernel's int32 lanes: quad q adds to lane q % 8

# format -> (bytes per super-block, weights per scale, int32 entries per row and super-block: _row_entries)
FORMATS = {qb.Q4_K: (144, 32, 12), qb.Q6_K: (210, 16, 24)}


def _const(t, values):
    return ir.Constant(ir.VectorType(t, len(values)), list(values))


def _low_halves(builder, v16):
    """<n x i16> -> <n x i32> with each value in the low half of its lane, 0 in the high (a vpdpwssd scale)."""
    return builder.zext(v16, ir.VectorType(_I32, v16.type.count))


def _row_entries(builder, qtype, sb):
    """A super-block's scale entries for one row, as int32: Q4_K: scales 0-7 (low halves), then the pairs
    (min 2i, min 2i + 1) as int16 pairs; Q6_K: scales 0-15 (low halves), then the pairs (2l, 2l + 1)."""
    if qtype == qb.Q4_K:
        scales_mins = q4_k_scales_mins(builder, sb)  # <16 x i16>: eight scales, eight mins
        scales = _low_halves(builder, builder.shuffle_vector(scales_mins, scales_mins, _const(_I32, range(8))))
        mins = builder.bitcast(scales_mins, ir.VectorType(_I32, 8))  # lanes 4-7: the pairs of mins
        return builder.shuffle_vector(scales, mins, _const(_I32, list(range(8)) + [12, 13, 14, 15]))
    scales8 = builder.load(builder.bitcast(builder.gep(sb, [ir.Constant(_I32, 192)]),
                                           ir.VectorType(ir.IntType(8), 16).as_pointer()), align=1)
    scales16 = builder.sext(scales8, ir.VectorType(_I16, 16))
    pairs = builder.bitcast(scales16, ir.VectorType(_I32, 8))
    pairs = builder.shuffle_vector(pairs, pairs, _const(_I32, list(range(8)) * 2))  # as wide as the scales
    return builder.shuffle_vector(_low_halves(builder, scales16), pairs, _const(_I32, range(24)))


def _row_values(builder, qtype, sb):
    """A super-block's 256 unsigned values in order, as four <16 x i32> (quads 16j .. 16j + 15)."""
    if qtype == qb.Q4_K:
        low, high = q4_k_values(builder, sb)
        halves = [v for j in range(4) for v in (low[j], high[j])]
    else:
        halves = q6_k_values(builder, sb)
    return [builder.bitcast(builder.shuffle_vector(halves[2 * j], halves[2 * j + 1], _const(_I32, range(64))), _IVEC)
            for j in range(4)]


def make_unpack(qtype):
    """unpack(w, r0, packed, entries, d, dmin): weight rows r0 .. r0 + 15 of w [rows, row bytes] into the tile:
    super-block b's quad q of every row side by side in packed[b, q] ([super-blocks, 64, 16, 4] uint8), its
    scale entries (_row_entries) in entries[b] ([super-blocks, entries, 16] int32), its f16 d and (Q4_K) dmin
    in d[b] and dmin[b] ([super-blocks, 16] float32). Past the weight's last row, that row again."""
    block_bytes, _, n_entries = FORMATS[qtype]

    @intrinsic
    def unpack(typingctx, w, r0, packed, entries, d, dmin):
        def codegen(context, builder, sig, args):
            w_a, packed_a, entries_a, d_a, dmin_a = (context.make_array(sig.args[i])(context, builder, args[i])
                                                     for i in (0, 2, 3, 4, 5))
            r0_v = args[1]
            c = lambda v: ir.Constant(r0_v.type, v)  # noqa: E731
            row_bytes = cgutils.unpack_tuple(builder, w_a.shape, 2)[1]
            rows = tile_rows(builder, w_a, r0_v)
            tile = builder.bitcast(packed_a.data, _IVEC.as_pointer())
            entry_vectors = builder.bitcast(entries_a.data, _IVEC.as_pointer())
            half16 = ir.VectorType(ir.HalfType(), ROWS)
            with cgutils.for_range(builder, builder.udiv(row_bytes, c(block_bytes))) as loop:
                b = loop.index
                sbs = [builder.gep(row, [builder.mul(b, c(block_bytes))]) for row in rows]
                values = [_row_values(builder, qtype, sb) for sb in sbs]
                for j in range(4):
                    for i, quads in enumerate(transpose_rows(builder, [v[j] for v in values])):
                        builder.store(quads, builder.gep(tile, [builder.add(builder.mul(b, c(_QUADS)), c(16 * j + i))]),
                                      align=4)
                for e, lanes in enumerate(transpose_rows(builder, [_row_entries(builder, qtype, sb) for sb in sbs])):
                    builder.store(lanes, builder.gep(entry_vectors, [builder.add(builder.mul(b, c(n_entries)), c(e))]),
                                  align=4)
                fields = ((208, d_a),) if qtype == qb.Q6_K else ((0, d_a), (2, dmin_a))
                for at, array in fields:
                    halves = ir.Constant(half16, None)
                    for r, sb in enumerate(sbs):
                        h = builder.load(builder.bitcast(builder.gep(sb, [c(at)]), ir.HalfType().as_pointer()), align=1)
                        halves = builder.insert_element(halves, h, ir.Constant(_I32, r))
                    dst = builder.bitcast(builder.gep(array.data, [builder.mul(b, c(ROWS))]), _FVEC.as_pointer())
                    builder.store(builder.fpext(halves, _FVEC), dst, align=4)
            return context.get_dummy_value()

        return types.none(w, r0, packed, entries, d, dmin), codegen

    return unpack


def _dpwssd(builder, acc, a, b):
    """acc + a.lo * b.lo + a.hi * b.hi in each int32 lane (int16 halves)."""
    return _call(builder, "llvm.x86.avx512.vpdpwssd.512", _IVEC, [acc, a, b])


def _make_kernel(qtype):
    """rows(packed, entries, d, dmin, kq, kd, kbsums, n, out, col0): out[n, col0 : col0 + 16] = the dots of the
    tile's 16 weight rows with input row n (kq int8 [m, cols], kd float32 [m, super-blocks] and kbsums int16
    [m, cols / 16]: k_quant_dot.quantize_into's activations)."""
    _, per_scale, n_entries = FORMATS[qtype]
    mins = qtype == qb.Q4_K

    @intrinsic
    def rows(typingctx, packed, entries, d, dmin, kq, kd, kbsums, n, out, col0):
        def codegen(context, builder, sig, args):
            a, n_v, col0_v = kernel_arguments(context, builder, sig, args)
            i64 = n_v.type
            c = lambda v: ir.Constant(i64, v)  # noqa: E731
            blocks = cgutils.unpack_tuple(builder, a[0].shape, 4)[0]
            cols = cgutils.unpack_tuple(builder, a[4].shape, 2)[1]
            tile = builder.bitcast(a[0].data, _IVEC.as_pointer())
            entry_vectors = builder.bitcast(a[1].data, _IVEC.as_pointer())
            kq_row, kd_row = _row_of(builder, a[4], n_v, cols), _row_of(builder, a[5], n_v, blocks)
            bsums_row = _row_of(builder, a[6], n_v, builder.mul(blocks, c(16)))
            accs = [cgutils.alloca_once_value(builder, ir.Constant(_FVEC, None)) for _ in range(_LANES)]
            accs_m = [cgutils.alloca_once_value(builder, ir.Constant(_FVEC, None)) for _ in range(4 if mins else 0)]
            zero = ir.Constant(_IVEC, None)

            def entry(b, e):
                return builder.load(builder.gep(entry_vectors, [builder.add(builder.mul(b, c(n_entries)), c(e))]),
                                    align=4)

            def floats(array, b):
                return builder.load(builder.bitcast(builder.gep(array.data, [builder.mul(b, c(ROWS))]),
                                                    _FVEC.as_pointer()), align=4)

            def pair_of(sums16, i):
                """Input pair i of an <n x i16> (two int16 values in an int32) in every lane."""
                pairs = builder.bitcast(sums16, ir.VectorType(_I32, sums16.type.count // 2))
                return _splat(builder, builder.extract_element(pairs, ir.Constant(_I32, i)), ROWS)

            with cgutils.for_range(builder, blocks) as loop:
                b = loop.index
                xd_b = _splat(builder, builder.load(builder.gep(kd_row, [b])), ROWS)
                sums16 = builder.load(builder.bitcast(builder.gep(bsums_row, [builder.mul(b, c(16))]),
                                                      ir.VectorType(_I16, 16).as_pointer()), align=2)
                def dots(q):  # quad q, as the tile's 32-weight block 8b + q // 8, its quad q % 8
                    return _quad_dot(builder, tile, kq_row, builder.add(builder.mul(b, c(8)), c(q // 8)), q % 8, zero)

                sumi = [zero] * _LANES
                for q in range(_QUADS):
                    sumi[q % _LANES] = _dpwssd(builder, sumi[q % _LANES], dots(q), entry(b, 4 * q // per_scale))
                if mins:  # lane i: min 2i times the input's sum of 32 number 2i, plus the same for 2i + 1
                    sums32 = builder.add(*(builder.shuffle_vector(sums16, sums16, _const(_I32, range(k, 16, 2)))
                                           for k in (0, 1)))
                    dmin = builder.fmul(builder.fneg(xd_b), floats(a[3], b))
                    for i, acc_m in enumerate(accs_m):
                        prod = _dpwssd(builder, zero, entry(b, 8 + i), pair_of(sums32, i))
                        builder.store(multiply_add(builder, dmin, builder.sitofp(prod, _FVEC), builder.load(acc_m)),
                                      acc_m)
                else:  # Q6_K's values are q + 32: 32 times each scale times the input's sum of its 16 comes off
                    for lane in range(_LANES):
                        offset = _dpwssd(builder, zero, entry(b, 16 + lane), pair_of(sums16, lane))
                        sumi[lane] = builder.sub(sumi[lane], builder.shl(offset, _splat(builder, ir.Constant(_I32, 5),
                                                                                         ROWS)))
                d = builder.fmul(xd_b, floats(a[2], b))
                for lane, acc in enumerate(accs):
                    builder.store(multiply_add(builder, d, builder.sitofp(sumi[lane], _FVEC), builder.load(acc)), acc)
            # the row kernel's ending: lanes (4 + i) + i, then (0 + 2) + (1 + 3); the mins' (0 + 2) + (1 + 3) after
            acc = [builder.load(v) for v in accs]
            r = [builder.fadd(acc[4 + i], acc[i]) for i in range(4)]
            total = builder.fadd(builder.fadd(r[0], r[2]), builder.fadd(r[1], r[3]))
            if mins:
                m = [builder.load(v) for v in accs_m]
                total = builder.fadd(total, builder.fadd(builder.fadd(m[0], m[2]), builder.fadd(m[1], m[3])))
            _store_rows(context, builder, a[8], sig.args[8], n_v, col0_v, total)
            return context.get_dummy_value()

        return types.none(packed, entries, d, dmin, kq, kd, kbsums, n, out, col0), codegen

    return rows


def products_of(qtype):
    """products(w, act, Y) for a format in FORMATS: Y = the products of every weight row of w with every input
    row (act: kernels.cpu.quant_dot.Activations: kq, kd, kbsums as k_quant_dot.quantize_into gives them), 16
    weight rows at a time (the last group may be short)."""
    unpack, kernel = make_unpack(qtype), _make_kernel(qtype)
    n_entries = FORMATS[qtype][2]

    def products(w, act, Y):
        kq, kd, kbsums = act.kq, act.kd, act.kbsums
        m, blocks = kd.shape
        packed = np.empty((blocks, _QUADS, ROWS, 4), np.uint8)
        entries = np.empty((blocks, n_entries, ROWS), np.int32)
        d = np.empty((blocks, ROWS), np.float32)
        dmin = np.empty((blocks, ROWS), np.float32)
        for r0 in range(0, w.shape[0], ROWS):
            unpack(w, r0, packed, entries, d, dmin)
            for n in range(m):
                kernel(packed, entries, d, dmin, kq, kd, kbsums, n, Y, r0)
    return njit(inline="always")(products)
