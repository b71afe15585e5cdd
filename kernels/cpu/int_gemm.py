"""The prefill product as an integer GEMM: many input rows times GGUF weights, without dequantizing.

Past a few input rows the arithmetic, not the weights' bytes, is the cost. Float GEMM on dequantized tiles
runs at the FMA units' peak; integer multiply-add instructions do twice the products per instruction
(`vpdpwssd` with AVX-512 VNNI: 32 products of int16 pairs summed into 16 int32 lanes; `pmaddwd` elsewhere).
To use them without a horizontal sum per dot, tiles of TILE_ROWS weight rows are repacked per call so that
one vector holds two consecutive weights of each of LANES rows, and a broadcast of two inputs multiplies
them all: one instruction advances LANES dots by two columns, and the lanes never need reducing.

Every supported format becomes the same thing per block of 32 weights: int16 values q with a float scale
s and offset o, w = s * q - o (Q4_0's d * (q - 8) is s = d, o = 8d; Q4_K's is
s = d * sc, o = dmin * m). Inputs are quantized per row to int16 blocks of 32 (x ~ xd * xq, 15 bits: the
precision of the float GEMM it replaces, where the row-wise product's int8 activations lose Qwen2.5's
q8_0-cache agreement), so a block's contribution is xd * (s * sum(q * xq) - o * sum(xq)), its integer
sums exact.

Q6_K's 16-weight scales are small integers: they are folded into its values (int16 sc * (q - 32)), and
its inputs take 13 bits so the int32 sums cannot overflow.

Each output row is computed by the same sequence whatever the number of rows or their tile, so the
results do not depend on the batch shape. The float formats, Q2_K, Q3_K and rows not a multiple of
TILE_ROWS keep the dequantized tiles and sgemm (kernels/cpu/quant.py decides).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from kernels.common import formats
from kernels.common import quant_blocks as qb
from kernels.common.cpu_target import has
from kernels.common.formats import switch
from kernels.common.quant_blocks import KERNEL, k_scale_min, load_f16
from kernels.cpu.int8_dot import _fifth_bits, _low_high

_AVX512 = has("avx512bw")
_VNNI = _AVX512 and has("avx512vnni")
_AVX2 = has("avx2")

# int32 lanes of one vector: 16 with AVX-512, 8 with AVX2
LANES = 16 if _AVX512 else 8
# weight rows per tile, in vectors of LANES rows: each broadcast input pair then feeds VECTORS products
# (AVX-512 has the 32 registers for two vectors' accumulators of four input rows; AVX2 has 16)
VECTORS = 2 if _AVX512 else 1
TILE_ROWS = LANES * VECTORS
_BLOCK = 32
_GROUPS = _BLOCK // 2  # column pairs per block

# format -> (bytes per block, weights per block: 32, or a K-quant's 256-weight super-block)
_LAYOUT = {qb.Q4_0: (18, 32), qb.Q4_1: (20, 32), qb.Q5_0: (22, 32), qb.Q5_1: (24, 32), qb.Q8_0: (34, 32),
           qb.Q4_K: (144, 256), qb.Q5_K: (176, 256), qb.Q6_K: (210, 256)}
# The int32 sums of a block must not overflow: 32 products of a weight value (unsigned, at most 255; Q6_K's
# sc * (q - 32) up to 128 * 32 = 4096 in magnitude) and an input value, whose bound is set per format.
_INPUT_LIMIT = {qtype: 32767 for qtype in _LAYOUT} | {qb.Q6_K: 8191}


def supports(qtype: int, rows: int) -> bool:
    """Whether this host runs the integer GEMM for a weight of this type and row count."""
    return _AVX2 and qtype in _LAYOUT and rows % TILE_ROWS == 0


_I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F32 = ir.FloatType()


def _vec(t, n):
    return ir.VectorType(t, n)


def _call(builder, name, ret, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _splat(builder, scalar, n):
    v = builder.insert_element(ir.Constant(_vec(scalar.type, n), None), scalar, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(_vec(_I32, n), [0] * n))


# --- repacking: a weight's blocks as (q, s, o), LANES rows interleaved -----------------------------------
# The values are unpacked in LLVM IR, a block's 32 at once (as the row-wise dots unpack them), widened to
# int16 and stored as sixteen pairs at their places in the tile; the scales are a few scalars per block.


def _k_quant_values(qs_at, qh_at=None):
    """Unpacker of a K-quant's sub-block `sub` (0-7) of the super-block at ptr: the low or high nibbles of
    qs[32 * (sub // 2) ...], with Q5_K's fifth bit from bit `sub` of qh[0..31]."""
    def values(builder, ptr, sub):
        c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
        qs = builder.gep(ptr, [builder.add(c64(qs_at), builder.mul(builder.udiv(sub, c64(2)), c64(32)))])
        packed = builder.load(builder.bitcast(qs, _vec(_I8, 32).as_pointer()), align=1)
        shift = _splat(builder, builder.trunc(builder.mul(builder.urem(sub, c64(2)), c64(4)), _I8), 32)
        q = builder.and_(builder.lshr(packed, shift), ir.Constant(_vec(_I8, 32), [15] * 32))
        if qh_at is None:
            return q
        qh = builder.load(builder.bitcast(builder.gep(ptr, [c64(qh_at)]), _vec(_I8, 32).as_pointer()), align=1)
        bit = builder.and_(builder.lshr(qh, _splat(builder, builder.trunc(sub, _I8), 32)),
                           ir.Constant(_vec(_I8, 32), [1] * 32))
        return builder.or_(q, builder.shl(bit, ir.Constant(_vec(_I8, 32), [4] * 32)))
    return values


def _block_values(qs_at, qh_at=None):
    """Unpacker of a 32-weight block: Q4_0/Q4_1's nibbles, with Q5_0/Q5_1's fifth bits."""
    def values(builder, ptr, sub):
        q = _low_high(builder, builder.gep(ptr, [ir.Constant(_I64, qs_at)]))
        if qh_at is not None:
            q = builder.or_(q, _fifth_bits(builder, builder.gep(ptr, [ir.Constant(_I64, qh_at)])))
        return q
    return values


def _q8_0_values(builder, ptr, sub):
    """Q8_0's int8 values v as v + 128."""
    v = builder.load(builder.bitcast(builder.gep(ptr, [ir.Constant(_I64, 2)]), _vec(_I8, 32).as_pointer()), align=1)
    return builder.xor(v, ir.Constant(_vec(_I8, 32), [128] * 32))


def _make_unpack_row(qtype, values, quads=False):
    """unpack(row, packed, lane): every block of the weight row `row` (uint8 [row_bytes]) as unsigned
    values, into packed[:, :, lane, :] (a tile: packed [blocks, 16, tile rows, 2] int16, or with `quads`
    packed [blocks, 8, tile rows, 4] uint8: each block's values in groups of two or four side by side), for a
    weight of GGML type `qtype`, whose format blocks hold one block of 32 or (K-quants) eight;
    values(builder, format_block_ptr, sub) gives block `sub`'s, unsigned bytes or (not with quads) int16."""
    block_bytes, block_weights = _LAYOUT[qtype]
    per_block = block_weights // _BLOCK
    groups = _BLOCK // 4 if quads else _GROUPS

    @intrinsic
    def unpack(typingctx, row, packed, lane):
        def codegen(context, builder, sig, args):
            row_a, packed_a = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 1))
            lane_v = args[2]
            c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
            blocks, _, tile_rows, _ = cgutils.unpack_tuple(builder, packed_a.shape, 4)
            base = builder.bitcast(packed_a.data, _I32.as_pointer())  # a group per i32
            with cgutils.for_range(builder, blocks) as loop:
                b = loop.index
                ptr = builder.gep(row_a.data, [builder.mul(builder.udiv(b, c64(per_block)), c64(block_bytes))])
                q = values(builder, ptr, builder.urem(b, c64(per_block)))
                if q.type.element == _I8 and not quads:  # unsigned values
                    q = builder.zext(q, _vec(_I16, 32))
                grouped = builder.bitcast(q, _vec(_I32, groups))
                first = builder.add(builder.mul(b, builder.mul(c64(groups), tile_rows)), lane_v)
                for g in range(groups):
                    builder.store(builder.extract_element(grouped, ir.Constant(_I32, g)),
                                  builder.gep(base, [builder.add(first, builder.mul(c64(g), tile_rows))]), align=1)
            return context.get_dummy_value()

        return types.none(row, packed, lane), codegen

    return unpack


_unpack_q4_0 = _make_unpack_row(qb.Q4_0, _block_values(2))
_unpack_q4_1 = _make_unpack_row(qb.Q4_1, _block_values(4))
_unpack_q5_0 = _make_unpack_row(qb.Q5_0, _block_values(6, 2))
_unpack_q5_1 = _make_unpack_row(qb.Q5_1, _block_values(8, 4))
_unpack_q8_0 = _make_unpack_row(qb.Q8_0, _q8_0_values)
_unpack_q4_k = _make_unpack_row(qb.Q4_K, _k_quant_values(16))
_unpack_q5_k = _make_unpack_row(qb.Q5_K, _k_quant_values(48, 16))


def q6_k_quants(builder, ptr, sub):
    """Q6_K's block `sub` (0-7) of the super-block at ptr as its unsigned 6-bit values q (<32 x i8>). Block
    sub = 4h + quarter takes the low (quarter < 2) or high nibbles of ql[64h + 32 (quarter & 1) ...] and bits
    2 quarter, 2 quarter + 1 of qh[32h ...] (as quant_blocks.decode_q6_k)."""
    c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
    i8x32 = _vec(_I8, 32)
    half, quarter = builder.udiv(sub, c64(4)), builder.urem(sub, c64(4))
    ql_at = builder.add(builder.mul(half, c64(64)), builder.mul(builder.and_(quarter, c64(1)), c64(32)))
    ql = builder.load(builder.bitcast(builder.gep(ptr, [ql_at]), i8x32.as_pointer()), align=1)
    nibble = _splat(builder, builder.trunc(builder.mul(builder.udiv(quarter, c64(2)), c64(4)), _I8), 32)
    low = builder.and_(builder.lshr(ql, nibble), ir.Constant(i8x32, [15] * 32))
    qh_at = builder.add(c64(128), builder.mul(half, c64(32)))
    qh = builder.load(builder.bitcast(builder.gep(ptr, [qh_at]), i8x32.as_pointer()), align=1)
    high = builder.and_(builder.lshr(qh, _splat(builder, builder.trunc(builder.mul(quarter, c64(2)), _I8), 32)),
                        ir.Constant(i8x32, [3] * 32))
    return builder.or_(low, builder.shl(high, ir.Constant(i8x32, [4] * 32)))


def _q6_k_values(builder, ptr, sub):
    """Q6_K's block `sub` of the super-block at ptr as int16 sc * (q - 32), its 16-weight scales sc (int8)
    folded in, so the block's scale is the super-block's d alone."""
    c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
    q = q6_k_quants(builder, ptr, sub)
    centred = builder.sub(builder.zext(q, _vec(_I16, 32)), ir.Constant(_vec(_I16, 32), [32] * 32))
    scales = builder.load(builder.bitcast(builder.gep(ptr, [builder.add(c64(192), builder.mul(sub, c64(2)))]),
                                          _vec(_I8, 2).as_pointer()), align=1)
    per_weight = builder.shuffle_vector(scales, scales, ir.Constant(_vec(_I32, 32), [j // 16 for j in range(32)]))
    return builder.mul(centred, builder.sext(per_weight, _vec(_I16, 32)))


_unpack_q6_k = _make_unpack_row(qb.Q6_K, _q6_k_values)


# (s, o) of block b (of 32 weights) of a weight row: w = s * q - o for its unsigned values q, per format


def _d_offset(qtype, offset):
    """Formats w = d * (q - offset): (d, d * offset)."""
    block_bytes = _LAYOUT[qtype][0]

    def scale_offset(row, b):
        d = load_f16(row, b * block_bytes)
        return d, d * np.float32(offset)
    return njit(inline="always")(scale_offset)


def _d_min(qtype):
    """Formats w = d * q + m: (d, -m)."""
    block_bytes = _LAYOUT[qtype][0]

    def scale_offset(row, b):
        return load_f16(row, b * block_bytes), -load_f16(row, b * block_bytes + 2)
    return njit(inline="always")(scale_offset)


def _k_quant_scale_min(qtype):
    """Q4_K, Q5_K: w = d * sc * q - dmin * m, sub-block b % 8 of super-block b // 8."""
    block_bytes = _LAYOUT[qtype][0]

    def scale_offset(row, b):
        o = (b // 8) * block_bytes
        sc, mn = k_scale_min(row, o + 4, b % 8)
        return load_f16(row, o) * sc, load_f16(row, o + 2) * mn
    return njit(inline="always")(scale_offset)


@njit(inline="always")
def _q6_k_scale_offset(row, b):
    return load_f16(row, (b // 8) * 210 + 208), np.float32(0)  # its 16-weight scales are in the values


_scale_offset = switch({
    qb.Q4_0: _d_offset(qb.Q4_0, 8), qb.Q4_1: _d_min(qb.Q4_1), qb.Q5_0: _d_offset(qb.Q5_0, 16),
    qb.Q5_1: _d_min(qb.Q5_1), qb.Q8_0: _d_offset(qb.Q8_0, 128), qb.Q6_K: _q6_k_scale_offset,
    qb.Q4_K: _k_quant_scale_min(qb.Q4_K), qb.Q5_K: _k_quant_scale_min(qb.Q5_K),
}, ("row", "b"))

_unpack_row = switch({
    qb.Q4_0: _unpack_q4_0, qb.Q4_1: _unpack_q4_1, qb.Q5_0: _unpack_q5_0, qb.Q5_1: _unpack_q5_1,
    qb.Q8_0: _unpack_q8_0, qb.Q4_K: _unpack_q4_k, qb.Q6_K: _unpack_q6_k, qb.Q5_K: _unpack_q5_k,
}, ("row", "packed", "lane"))


@njit(**KERNEL)
def _repack_tile(formats, qtype, w, t, packed, s, o):
    """Weight rows t*TILE_ROWS.. of w [rows, row_bytes] -> packed [blocks, 16, TILE_ROWS, 2] int16 (the two
    values of column pair g of block b of each tile row side by side), s and o [blocks, TILE_ROWS]."""
    for lane in range(TILE_ROWS):
        row = w[t * TILE_ROWS + lane]
        _unpack_row(formats, qtype, row, packed, lane)
        for b in range(packed.shape[0]):
            s[b, lane], o[b, lane] = _scale_offset(formats, qtype, row, b)


# --- the micro-kernel: one tile of weight rows times up to four input rows, in LLVM IR -----------------

def _pair_dot(builder, acc, w, x2):
    """acc + per lane the dot of its two int16 weights (w, <2*LANES x i16>) with the two int16 inputs x2
    (an i32 holding them), as <LANES x i32>."""
    xs = _splat(builder, x2, LANES)
    if _VNNI:
        return _call(builder, "llvm.x86.avx512.vpdpwssd.512", acc.type, [acc, builder.bitcast(w, acc.type), xs])
    name = "llvm.x86.avx512.pmaddw.d.512" if _AVX512 else "llvm.x86.avx2.pmadd.wd"
    return builder.add(acc, _call(builder, name, acc.type, [w, builder.bitcast(xs, w.type)]))


def _fma(builder, a, b, c):
    """a * b + c as one explicit fused multiply-add (no compilation decides on its own whether to fuse)."""
    return _call(builder, f"llvm.fma.v{a.type.count}f32", a.type, [a, b, c])


def _make_tile_kernel(n_rows):
    """tile(packed, s, o, xq, xd, xs, r0, out, col_tile): out[r0 + i, col_tile*TILE_ROWS :
    (col_tile+1)*TILE_ROWS] for i < n_rows: the products of the packed weight tile (as _repack_tile leaves
    it) with input rows r0 + i (xq [m, cols] int16, xd and xs = xd * sum(xq) [m, blocks] float32)."""

    @intrinsic
    def tile(typingctx, packed, s, o, xq, xd, xs, r0, out, col_tile):
        def codegen(context, builder, sig, args):
            arrays = [context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 1, 2, 3, 4, 5, 7)]
            packed_a, s_a, o_a, xq_a, xd_a, xs_a, out_a = arrays
            r0_v = args[6]
            blocks = cgutils.unpack_tuple(builder, packed_a.shape, 4)[0]
            cols = cgutils.unpack_tuple(builder, xq_a.shape, 2)[1]
            out_cols = cgutils.unpack_tuple(builder, out_a.shape, 2)[1]

            def c64(v):
                return ir.Constant(_I64, v)

            def vector_at(base, index, vtype, align):
                return builder.load(builder.bitcast(builder.gep(base, [index]), vtype.as_pointer()), align=align)

            fvec, ivec, wvec = _vec(_F32, LANES), _vec(_I32, LANES), _vec(_I16, 2 * LANES)
            w_tile, s_tile, o_tile = packed_a.data, s_a.data, o_a.data
            rows = [builder.add(r0_v, c64(i)) for i in range(n_rows)]
            xq_rows = [builder.gep(xq_a.data, [builder.mul(r, cols)]) for r in rows]
            xd_rows = [builder.gep(xd_a.data, [builder.mul(r, blocks)]) for r in rows]
            xs_rows = [builder.gep(xs_a.data, [builder.mul(r, blocks)]) for r in rows]
            accs = [[cgutils.alloca_once_value(builder, ir.Constant(fvec, None)) for _ in range(VECTORS)]
                    for _ in rows]

            with cgutils.for_range(builder, blocks) as loop:
                b = loop.index
                w_block = builder.gep(w_tile, [builder.mul(b, c64(_BLOCK * TILE_ROWS))])
                x_blocks = [builder.bitcast(builder.gep(x, [builder.mul(b, c64(_BLOCK))]), _I32.as_pointer())
                            for x in xq_rows]
                isums = [[ir.Constant(ivec, None)] * VECTORS for _ in rows]
                for g in range(_GROUPS):
                    ws = [vector_at(w_block, c64((g * VECTORS + v) * 2 * LANES), wvec, 2) for v in range(VECTORS)]
                    for i in range(n_rows):
                        x2 = builder.load(builder.gep(x_blocks[i], [c64(g)]), align=2)
                        isums[i] = [_pair_dot(builder, isums[i][v], ws[v], x2) for v in range(VECTORS)]
                at = builder.mul(b, c64(TILE_ROWS))
                for v in range(VECTORS):
                    lanes_at = builder.add(at, c64(v * LANES))
                    sv = vector_at(s_tile, lanes_at, fvec, 4)
                    neg_o = builder.fneg(vector_at(o_tile, lanes_at, fvec, 4))
                    for i in range(n_rows):
                        xd_b = _splat(builder, builder.load(builder.gep(xd_rows[i], [b])), LANES)
                        xs_b = _splat(builder, builder.load(builder.gep(xs_rows[i], [b])), LANES)
                        scaled = builder.fmul(builder.sitofp(isums[i][v], fvec), sv)
                        acc = _fma(builder, scaled, xd_b, builder.load(accs[i][v]))
                        builder.store(_fma(builder, neg_o, xs_b, acc), accs[i][v])

            col0 = builder.mul(args[8], c64(TILE_ROWS))
            for i, r in enumerate(rows):
                for v in range(VECTORS):
                    dst = builder.gep(out_a.data, [builder.add(builder.mul(r, out_cols), builder.add(col0, c64(v * LANES)))])
                    builder.store(builder.load(accs[i][v]), builder.bitcast(dst, fvec.as_pointer()), align=4)
            return context.get_dummy_value()

        return types.none(packed, s, o, xq, xd, xs, r0, out, col_tile), codegen

    return tile


def over_input_rows(tile_4, tile_3, tile_2, tile_1):
    """run(m, packed, s, o, xq, xd, xs, out, col): a weight tile's micro-kernels (tile_n(packed, s, o, xq, xd,
    xs, r0, out, col) for input rows r0 .. r0 + n - 1) over input rows 0 .. m - 1. Input rows go in fours,
    whose accumulators stay in registers while each weight block is loaded once for all of them; the last
    rows in a tile of three, two or one."""
    def run(m, packed, s, o, xq, xd, xs, out, col):
        r0 = 0
        while r0 + 4 <= m:
            tile_4(packed, s, o, xq, xd, xs, r0, out, col)
            r0 += 4
        left = m - r0
        if left == 3:
            tile_3(packed, s, o, xq, xd, xs, r0, out, col)
        elif left == 2:
            tile_2(packed, s, o, xq, xd, xs, r0, out, col)
        elif left == 1:
            tile_1(packed, s, o, xq, xd, xs, r0, out, col)
    return njit(inline="always")(run)


_over_input_rows = over_input_rows(*(_make_tile_kernel(n) for n in (4, 3, 2, 1)))


@njit(parallel=True, **KERNEL)
def _input_blocks(X, limit):
    """X [m, cols] float32 quantized per row to int16 blocks of 32: xq [m, cols] int16 within ±limit
    (rounded half away from zero), xd [m, cols/32] the float32 scales (x ~ xd * xq) and xs = xd * sum(xq)."""
    m, cols = X.shape
    xq = np.empty((m, cols), np.int16)
    xd = np.empty((m, cols // 32), np.float32)
    xs = np.empty((m, cols // 32), np.float32)
    for n in prange(m):  # rows over threads: each row's quantization is its own
        for b in range(cols // 32):
            amax = np.float32(0)
            for j in range(b * 32, b * 32 + 32):
                amax = max(amax, abs(X[n, j]))
            d = amax / np.float32(limit)
            inv = np.float32(1) / d if d > 0 else np.float32(0)
            total = 0
            for j in range(b * 32, b * 32 + 32):
                scaled = X[n, j] * inv
                v = np.int16(np.trunc(scaled + np.copysign(np.float32(0.5), scaled)))
                xq[n, j] = v
                total += v
            xd[n, b], xs[n, b] = d, d * np.float32(total)
    return xq, xd, xs


@njit(parallel=True, **KERNEL)
def _gemm(formats, qtype, w, blocks, xq, xd, xs, out, chunks):
    """out = the products of w's rows with the input rows, the weight tiles split into `chunks` runs. Each
    run repacks one tile at a time into its own buffer, which stays in L2 while every input row passes
    over it (a whole repacked weight would go out to memory and back, and take page faults to allocate)."""
    tiles, m = w.shape[0] // TILE_ROWS, xq.shape[0]
    for c in prange(chunks):
        packed = np.empty((blocks, _GROUPS, TILE_ROWS, 2), np.int16)
        s = np.empty((blocks, TILE_ROWS), np.float32)
        o = np.empty((blocks, TILE_ROWS), np.float32)
        for t in range(c * tiles // chunks, (c + 1) * tiles // chunks):
            _repack_tile(formats, qtype, w, t, packed, s, o)
            _over_input_rows(m, packed, s, o, xq, xd, xs, out, t)


def matmul_into(qtype: int, w: np.ndarray, X: np.ndarray, Y: np.ndarray, threads: int) -> None:
    """Y [m, rows] = X [m, cols] @ W.T for a weight `supports` accepts (X float32, C-contiguous), over
    `threads` threads."""
    block_bytes, block_weights = _LAYOUT[qtype]
    xq, xd, xs = _input_blocks(X, _INPUT_LIMIT[qtype])
    _gemm(formats.of([qtype]), qtype, w, w.shape[1] // block_bytes * (block_weights // _BLOCK), xq, xd, xs, Y,
          min(threads, w.shape[0] // TILE_ROWS))
