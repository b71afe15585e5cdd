"""Integer block dots: 32 small unsigned weights times 32 int8 activations, summed in int32.

At decode the input vector is quantized once per matvec to int8 blocks of 32
with one float scale each (as llama.cpp's Q8_0 activations), so a weight block
costs one integer dot instead of 32 float multiply-adds. Each intrinsic loads
the packed bytes as one LLVM vector and unpacks the fields with vector shifts
and masks; the dot is AVX2's `pmaddubsw` + `pmaddwd` where the host has them
(Numba cannot reach them from scalar code: it widens integer arithmetic to
int64), else the same sums written as plain IR for any target.

`rows_dot_<format>` runs a whole weight row in LLVM IR against every input
row, unpacking each weight block once for a tile of input rows (`_tiled`).
The 32-weight formats keep their block products in float vectors, reduced once
per row (Q4_K and Q6_K, against activations in blocks of 256: k_quant_dot). Weights enter the dot
unsigned (at most 7 bits, so `pmaddubsw` never saturates): signed ones as |w|
with w's sign moved onto x (Q4_0's and Q5_0's stored offsets are taken off
the weights in int8 first; MXFP4's codes are looked up as ggml's kvalues_mxfp4), Q4_1's and Q5_1's mins
through the int sums of each activation block. Every row's arithmetic is the same whatever the number
of rows, so the row-wise forward's bits do not depend on m (and an AVX-512 host
gets an AVX2 host's bits: it only packs the same lanes differently).
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from kernels.common.cpu_target import has
from kernels.common.quant_blocks import MXFP4_VALUES
from kernels.common.f16 import f16_bits_to_f32, f32_to_f16_bits

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_AVX2 = has("avx2")
_FMA = has("fma")
# 512-bit integer dots: two 32-weight blocks per instruction, and with VNNI one instruction for the dot
_AVX512 = _AVX2 and has("avx512bw")
_VNNI = _AVX512 and has("avx512vnni")


def multiply_add(builder, a, b, acc):
    """acc + a * b for float vectors: one fused multiply-add where the host has FMA (an explicit
    `llvm.fma`, so no compilation decides on its own whether to fuse), else a multiply and an add."""
    if not _FMA:
        return builder.fadd(acc, builder.fmul(a, b))
    name = f"llvm.fma.v{a.type.count}f32"
    return _call(builder, name, a.type, [a, b, acc])


def _vec(t, n):
    return ir.VectorType(t, n)


def _const(t, values):
    return ir.Constant(_vec(t, len(values)), list(values))


def _call(builder, name, ret, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


# Weights stream from memory once per token: asking for them this far ahead keeps the
# loads in flight while the current block computes (measured 10-30% on 2-core decode).
PREFETCH_BYTES = 1024


def _prefetch(builder, ptr, ahead):
    """Hint that the bytes `ahead` past ptr will be read soon (no fault if they do not exist)."""
    i8p = ir.IntType(8).as_pointer()
    target = builder.gep(builder.bitcast(ptr, i8p), [ir.Constant(ir.IntType(64), ahead)])
    _call(builder, "llvm.prefetch.p0i8", ir.VoidType(), [target, ir.Constant(_I32, 0), ir.Constant(_I32, 3),
                                                          ir.Constant(_I32, 1)])


def _madd(builder, w, x):
    """Partial sums of zext(w) * sext(x) for <32 x i8> w (values <= 128) and x, as an i32 vector."""
    if _AVX2:
        pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", _vec(_I16, 16), [w, x])
        return _call(builder, "llvm.x86.avx2.pmadd.wd", _vec(_I32, 8), [pairs, _const(_I16, [1] * 16)])
    prod = builder.mul(builder.zext(w, _vec(_I16, 32)), builder.sext(x, _vec(_I16, 32)))
    return builder.sext(prod, _vec(_I32, 32))


def _madd_pair(builder, w, x):
    """_madd of two blocks at once (AVX-512): <64 x i8> w and x -> <16 x i32>, the same sums as _madd
    gives for each block, the first block's in lanes 0-7."""
    i32x16 = _vec(_I32, 16)
    if _VNNI:
        return _call(builder, "llvm.x86.avx512.vpdpbusd.512", i32x16,
                     [ir.Constant(i32x16, None), builder.bitcast(w, i32x16), builder.bitcast(x, i32x16)])
    pairs = _call(builder, "llvm.x86.avx512.pmaddubs.w.512", _vec(_I16, 32), [w, x])
    return _call(builder, "llvm.x86.avx512.pmaddw.d.512", i32x16, [pairs, _const(_I16, [1] * 32)])


def _low_high(builder, ptr):
    """The 32 4-bit weights packed in 16 bytes: weight j in the low nibble of byte j, j + 16 in its high."""
    packed = builder.load(builder.bitcast(ptr, _vec(_I8, 16).as_pointer()), align=1)
    # each half with one shift for all its bytes, then joined: x86 has no shift of bytes by different counts
    mask = ir.Constant(_vec(_I8, 16), [15] * 16)
    low = builder.and_(packed, mask)
    high = builder.and_(builder.lshr(packed, ir.Constant(_vec(_I8, 16), [4] * 16)), mask)
    return builder.shuffle_vector(low, high, _const(_I32, range(32)))


def _fifth_bits(builder, ptr):
    """16 where bit j of the little-endian uint32 at ptr is set, else 0, for j < 32."""
    qh = builder.load(builder.bitcast(ptr, _vec(_I8, 4).as_pointer()), align=1)
    qh = builder.shuffle_vector(qh, qh, _const(_I32, [j // 8 for j in range(32)]))
    bit = builder.and_(qh, _const(_I8, [1 << (j % 8) for j in range(32)]))
    zero = ir.Constant(_vec(_I8, 32), None)
    return builder.select(builder.icmp_unsigned("!=", bit, zero), _const(_I8, [16] * 32), zero)


def _f16(builder, ptr):
    """The little-endian f16 at ptr, as float."""
    half = builder.load(builder.bitcast(ptr, ir.HalfType().as_pointer()), align=1)
    return builder.fpext(half, ir.FloatType())


# input rows that share each unpacked weight block: a tile of four keeps its accumulators, the weights
# and the inputs in the 16 vector registers of AVX2
TILE = 4


def _tiled(dots, tile_rows=TILE):
    """An intrinsic rows_dot(w, r, xq, xd, xsum, out): out[n, r] = the dot of weight row w[r] with input
    row n, for every row n of xq [m, cols] (xd, xsum [m, blocks of 32], as `quantize` gives them per row).
    `dots(builder, row, nbytes, inputs)` emits the dots of the weight row at `row` (nbytes long) with a
    tile of input rows, inputs [(xq, xd, xsum row pointers)], and returns their float values. Input rows
    go in tiles of up to `tile_rows` that unpack each weight block once; `dots` runs the same sequence of
    operations for every row whatever the tile's size and the row's place in it (its own accumulators,
    the blocks in order), so each row's result is the bits of a one-row call."""

    @intrinsic
    def rows_dot(typingctx, w, r, xq, xd, xsum, out):
        # the weight comes whole with a row index: a row view per call would cost a reference count each
        def codegen(context, builder, sig, args):
            w_a, xq_a, xd_a, xsum_a, out_a = (context.make_array(sig.args[i])(context, builder, args[i])
                                              for i in (0, 2, 3, 4, 5))
            r_v = args[1]
            nbytes = cgutils.unpack_tuple(builder, w_a.shape, 2)[1]
            row = _item_ptr(context, builder, w_a, sig.args[0], r_v, ir.Constant(r_v.type, 0))
            m = cgutils.unpack_tuple(builder, xq_a.shape, 2)[0]

            def tile(n0, count):
                ns = [builder.add(n0, ir.Constant(n0.type, t)) for t in range(count)]
                zero = ir.Constant(n0.type, 0)
                inputs = [tuple(_item_ptr(context, builder, a, sig.args[i], n, zero)
                                for a, i in ((xq_a, 2), (xd_a, 3), (xsum_a, 4))) for n in ns]
                for n, value in zip(ns, dots(builder, row, nbytes, inputs)):
                    builder.store(value, _item_ptr(context, builder, out_a, sig.args[5], n, r_v))

            tile_c = ir.Constant(m.type, tile_rows)
            with cgutils.for_range(builder, builder.udiv(m, tile_c)) as loop:
                tile(builder.mul(loop.index, tile_c), tile_rows)
            # the rest in tiles of halving size (fewer tile sizes to compile), but the last three rows in one
            # tile: two then one would unpack each weight block twice, and a MoE prefill's experts often get three
            rest = builder.urem(m, tile_c)
            size = tile_rows // 2
            while size > 2:
                left = builder.and_(rest, ir.Constant(m.type, 2 * size - 1))  # rows not yet done
                with builder.if_then(builder.icmp_unsigned(">=", left, ir.Constant(m.type, size))):
                    tile(builder.sub(m, left), size)
                size //= 2
            left = builder.and_(rest, ir.Constant(m.type, 3))
            for count in (3, 2, 1):
                with builder.if_then(builder.icmp_unsigned("==", left, ir.Constant(m.type, count))):
                    tile(builder.sub(m, left), count)
            return context.get_dummy_value()

        return types.none(w, r, xq, xd, xsum, out), codegen

    return rows_dot


def _rows_dot(block_bytes, weights, offset=None, block_scale=_f16):
    """rows_dot (see _tiled) for a 32-weight block format: the dot of a weight row with an input row
    (xq, xd, xsum) is sum_b block_scale(block b) * xd[b] * (weights . xq block b) (the f16 at the block's
    first byte, or MXFP4's E8M0), plus, with
    offset = (byte, factor), factor * f16(block b at byte) * xd[b] * xsum[b] (the mins of Q4_1 and Q5_1).
    `weights(builder, block_ptr)` -> (unsigned weights <32 x i8>, None or the lanes whose weight is
    negative, whose x enters the dot negated). The block products accumulate in float vectors, reduced
    once per row."""
    lanes = 8 if _AVX2 else 32

    def dots(builder, row, nbytes, inputs):
        count = len(inputs)
        xq_rows, xd_rows, xsum_rows = zip(*inputs)
        nblocks = builder.udiv(nbytes, ir.Constant(nbytes.type, block_bytes))

        def accumulators(k):
            """Per row, a block-product accumulator of k * lanes floats and an offset one of k."""
            return ([cgutils.alloca_once_value(builder, ir.Constant(_vec(ir.FloatType(), k * lanes), None))
                     for _ in range(count)],
                    [cgutils.alloca_once_value(builder, ir.Constant(_vec(ir.FloatType(), k), None))
                     for _ in range(count)])

        def add_blocks(b, k, accs, offs):
            """Blocks b .. b + k - 1 into every row's accumulators: k = 1, or (AVX-512) 2 in one vector,
            which is two chains of k = 1 side by side, block b's in the low lanes (lane for lane the same
            operations)."""
            blocks = [builder.gep(row, [builder.mul(builder.add(b, ir.Constant(b.type, i)),
                                                    ir.Constant(b.type, block_bytes))]) for i in range(k)]
            for block in blocks:
                _prefetch(builder, block, PREFETCH_BYTES)
            unpacked = [weights(builder, block) for block in blocks]
            w = _join(builder, [u[0] for u in unpacked])
            negative = None if unpacked[0][1] is None else _join(builder, [u[1] for u in unpacked])
            d = _floats(builder, [block_scale(builder, block) for block in blocks])
            if offset is not None:
                d_offset = _floats(builder, [_f16(builder, _at(builder, block, offset[0])) for block in blocks])
                factor = ir.Constant(d.type, [offset[1]] * k)
            for t in range(count):
                x_ptr = builder.gep(xq_rows[t], [builder.mul(b, ir.Constant(b.type, 32))])
                x = builder.load(builder.bitcast(x_ptr, _vec(_I8, 32 * k).as_pointer()), align=1)
                if negative is not None:
                    x = builder.select(negative, builder.sub(ir.Constant(x.type, None), x), x)
                xd_b = _load_vec(builder, builder.gep(xd_rows[t], [b]), k)
                scale = builder.shuffle_vector(builder.fmul(d, xd_b), d, _const(_I32, [i // lanes for i in range(k * lanes)]))
                prods = builder.sitofp((_madd_pair if k == 2 else _madd)(builder, w, x), scale.type)
                builder.store(multiply_add(builder, prods, scale, builder.load(accs[t])), accs[t])
                if offset is not None:
                    xs_b = builder.sitofp(_load_vec(builder, builder.gep(xsum_rows[t], [b]), k), d.type)
                    term = builder.fmul(builder.fmul(builder.fmul(d_offset, xd_b), xs_b), factor)
                    builder.store(builder.fadd(builder.load(offs[t]), term), offs[t])

        # two independent accumulator chains per row (even and odd blocks) hide the add latency
        chains = [accumulators(1) for _ in range(2)]
        one = ir.Constant(nblocks.type, 1)
        # a lone row with an offset term runs faster block by block (measured on Q4_1: 7% at m = 1)
        if _AVX512 and (count > 1 or offset is None):
            pairs = accumulators(2)
            with cgutils.for_range(builder, builder.lshr(nblocks, one)) as loop:
                add_blocks(builder.shl(loop.index, one), 2, *pairs)
            for t in range(count):  # back to the two chains, for the odd block and the sums
                acc, off = builder.load(pairs[0][t]), builder.load(pairs[1][t])
                for c, (accs, offs) in enumerate(chains):
                    builder.store(builder.shuffle_vector(acc, acc, _const(_I32, range(c * lanes, (c + 1) * lanes))),
                                  accs[t])
                    builder.store(builder.shuffle_vector(off, off, _const(_I32, [c])), offs[t])
        else:
            with cgutils.for_range(builder, builder.lshr(nblocks, one)) as loop:
                b = builder.shl(loop.index, one)
                add_blocks(b, 1, *chains[0])
                add_blocks(builder.add(b, one), 1, *chains[1])
        with builder.if_then(builder.trunc(nblocks, ir.IntType(1))):
            add_blocks(builder.sub(nblocks, one), 1, *chains[0])
        values = []
        (accs0, offs0), (accs1, offs1) = chains
        for t in range(count):
            acc = builder.fadd(builder.load(accs0[t]), builder.load(accs1[t]))
            total = _call(builder, f"llvm.vector.reduce.fadd.v{lanes}f32", ir.FloatType(),
                          [ir.Constant(ir.FloatType(), 0), acc])
            offsets = builder.fadd(builder.load(offs0[t]), builder.load(offs1[t]))
            values.append(builder.fadd(total, builder.extract_element(offsets, ir.Constant(_I32, 0))))
        return values

    return _tiled(dots)


def _item_ptr(context, builder, ary, aryty, i, j):
    """The address of element [i, j] of a 2-d array argument."""
    return cgutils.get_item_pointer2(context, builder, ary.data, cgutils.unpack_tuple(builder, ary.shape, 2),
                                     cgutils.unpack_tuple(builder, ary.strides, 2), aryty.layout, [i, j])


def _floats(builder, values):
    """Floats as a <n x float>."""
    v = ir.Constant(_vec(ir.FloatType(), len(values)), None)
    for i, x in enumerate(values):
        v = builder.insert_element(v, x, ir.Constant(_I32, i))
    return v


def _join(builder, parts):
    """One vector, or two of the same type end to end."""
    return parts[0] if len(parts) == 1 else builder.shuffle_vector(parts[0], parts[1], _const(_I32, range(2 * parts[0].type.count)))


def _at(builder, ptr, offset):
    return builder.gep(ptr, [ir.Constant(ir.IntType(64), offset)])


def _q4(q_at):
    return lambda builder, block: (_low_high(builder, _at(builder, block, q_at)), None)


def _q5(qh_at, q_at):
    def weights(builder, block):
        low = _low_high(builder, _at(builder, block, q_at))
        return builder.or_(low, _fifth_bits(builder, _at(builder, block, qh_at))), None

    return weights


def _q8(builder, block):
    w = builder.load(builder.bitcast(_at(builder, block, 2), _vec(_I8, 32).as_pointer()), align=1)
    return _magnitude(builder, w)


def _centered(weights, zero):
    """Weights stored with an offset (Q4_0's 8, Q5_0's 16) as the signed values w - zero, exact in int8:
    the block dot is then the whole product, with no offset term to add per block and input row (the
    arithmetic of llama.cpp's q4_0/q5_0 dots)."""
    def signed(builder, block):
        w, _ = weights(builder, block)
        return _magnitude(builder, builder.sub(w, _const(_I8, [zero] * 32)))

    return signed


def _looked_up(builder, codes, table):
    """table[codes] for <32 x i8> codes in 0..15 and a 16-entry int8 table: AVX2's pshufb (the table in both
    128-bit lanes), else a select per entry."""
    if _AVX2:
        return _call(builder, "llvm.x86.avx2.pshuf.b", codes.type, [_const(_I8, list(table) * 2), codes])
    out = ir.Constant(codes.type, None)
    for code, value in enumerate(table):
        hit = builder.icmp_unsigned("==", codes, _const(_I8, [code] * 32))
        out = builder.select(hit, _const(_I8, [int(value)] * 32), out)
    return out


def _mxfp4(builder, block):
    """MXFP4's weights: its e2m1 codes (Q4_0's nibble order, after the scale byte) as twice their values."""
    return _magnitude(builder, _looked_up(builder, _low_high(builder, _at(builder, block, 1)), MXFP4_VALUES))


def _e8m0_half(builder, block):
    """The block's E8M0 scale byte as ggml's GGML_E8M0_TO_FP32_HALF: 2^(e - 128), from its float bits."""
    e = builder.zext(builder.load(block), _I32)
    small = builder.shl(ir.Constant(_I32, 0x00200000), e)
    normal = builder.shl(builder.sub(e, ir.Constant(_I32, 1)), ir.Constant(_I32, 23))
    is_small = builder.icmp_unsigned("<", e, ir.Constant(_I32, 2))
    return builder.bitcast(builder.select(is_small, small, normal), ir.FloatType())


rows_dot_q4_0 = _rows_dot(18, _centered(_q4(2), 8))
rows_dot_q4_1 = _rows_dot(20, _q4(4), offset=(2, 1.0))
rows_dot_q5_0 = _rows_dot(22, _centered(_q5(2, 6), 16))
rows_dot_q5_1 = _rows_dot(24, _q5(4, 8), offset=(2, 1.0))
rows_dot_q8_0 = _rows_dot(34, _q8)
rows_dot_mxfp4 = _rows_dot(17, _mxfp4, block_scale=_e8m0_half)  # llama.cpp's vec_dot_mxfp4_q8_0


def _x32(builder, xq, e):
    """The 32 int8 activations at xq + e (an element offset)."""
    return builder.load(builder.bitcast(builder.gep(xq, [e]), _vec(_I8, 32).as_pointer()), align=1)


def _load_vec(builder, ptr, n):
    """n consecutive 4-byte elements (float or int32) at ptr as a vector."""
    return builder.load(builder.bitcast(ptr, _vec(ptr.type.pointee, n).as_pointer()), align=4)


def _magnitude(builder, w):
    """(|w|, the lanes where w < 0) for signed <32 x i8> w: |w| . (x negated in those lanes) is w . x."""
    zero = ir.Constant(_vec(_I8, 32), None)
    negative = builder.icmp_signed("<", w, zero)
    return builder.select(negative, builder.sub(zero, w), w), negative


@njit(cache=True, nogil=True)
def quantize(x):
    """x (length a multiple of 32) -> int8 values, and per block of 32 the float32 scale
    (x ~ scale * value) and the int32 sum of the values (for the formats' offsets).

    As llama.cpp's quantize_row_q8_0: values rounded half away from zero, and the scale the dots use
    rounded to f16 (block_q8_0 stores it so) where f16 can hold it. The reference logits come from llama.cpp's own int8
    activations; quantizing the same way keeps our rounding from adding to theirs."""
    n = x.shape[0] // 32
    xq = np.empty(n * 32, np.int8)
    xd = np.empty(n, np.float32)
    xsum = np.empty(n, np.int32)
    quantize_into(x, xq, xd, xsum)
    return xq, xd, xsum


@njit(cache=True, nogil=True)
def quantize_into(x, xq, xd, xsum):
    """quantize(x), written to xq, xd, xsum (rows of the caller's arrays: copying returned arrays into them
    compiles a shape check with its error message, seconds of the first run's compilation)."""
    for b in range(x.shape[0] // 32):
        amax = np.float32(0)
        for j in range(32):
            amax = max(amax, abs(x[b * 32 + j]))
        d = amax / np.float32(127)
        inv = np.float32(1) / d if d > 0 else np.float32(0)
        s = 0
        for j in range(32):
            scaled = x[b * 32 + j] * inv
            v = np.int8(np.trunc(scaled + np.copysign(np.float32(0.5), scaled)))
            xq[b * 32 + j] = v
            s += v
        half = f16_bits_to_f32(f32_to_f16_bits(d))
        # an activation past f16's range keeps its exact scale rather than turn into inf or 0
        xd[b], xsum[b] = (half if np.isfinite(half) and (half > 0 or d == 0) else d), s
