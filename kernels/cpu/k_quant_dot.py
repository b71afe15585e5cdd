"""Q4_K and Q6_K weights times activations quantized as llama.cpp's Q8_K: int8 values in blocks of 256 with
one float scale and the sums of each 16 values.

A K-quant super-block carries integer sub-block scales (Q4_K's 6-bit scales and mins, Q6_K's int8 scales), so
against one activation scale per 256 values its whole dot is an integer: sum_j sc_j * (w_j . x_j), less the
mins (Q4_K) or the offset 32 (Q6_K) through the activation's sums of 16. That integer is exact in int32 in any
order, and a super-block costs one float multiply-add per lane, as in llama.cpp's AVX2 `vec_dot_q4_K_q8_K` /
`vec_dot_q6_K_q8_K` (the lanes and the final sums here are theirs: `pmaddubsw`, then `pmaddwd` by the
sub-block scale, eight int32 lanes per row, a float accumulator of eight lanes). Activations with a float
scale per 32 values (int8_dot's, for the 32-weight formats) would need that scale applied per sub-block in
float: about twice the instructions per byte of weight, where decode is a race for memory bandwidth.

`rows_dot_q4_k` and `rows_dot_q6_k` are int8_dot._tiled kernels: each weight super-block is unpacked once for
a tile of input rows, and every row's arithmetic is that of a one-row call. Without AVX2 the same lane sums
are written as plain IR (no sum saturates int16: |w| <= 63, |x| <= 127), so every host gets the same bits
given the same fused multiply-add choice (int8_dot.multiply_add).
"""

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils

from kernels.cpu.int_gemm import _splat
from kernels.cpu.int8_dot import (
    _AVX2, _AVX512, _I8, _I16, _I32, PREFETCH_BYTES, TILE, _at, _call, _const, _f16, _prefetch, _tiled, _vec, _x32,
    multiply_add,
)

QK = 256  # values per activation block (a K-quant super-block)
_F4, _F8 = _vec(ir.FloatType(), 4), _vec(ir.FloatType(), 8)


@njit(cache=True, nogil=True)
def quantize_into(x, q, d, bsums):
    """x (length a multiple of 256) as llama.cpp's quantize_row_q8_K: per block of 256, iscale = -127 / the
    value of largest magnitude, q = round-half-even(iscale * x), d = 1 / iscale (0 and all-zero q for an
    all-zero block), and bsums the sums of each 16 values of q."""
    for b in range(x.shape[0] // QK):
        amax = np.float32(0)
        vmax = np.float32(0)
        for j in range(QK):
            v = x[b * QK + j]
            if abs(v) > amax:
                amax, vmax = abs(v), v
        if amax == 0:
            d[b] = 0
            for j in range(QK):
                q[b * QK + j] = 0
            for g in range(QK // 16):
                bsums[b * QK // 16 + g] = 0
            continue
        iscale = np.float32(-127) / vmax
        for g in range(QK // 16):
            s = 0
            for j in range(16):
                v = min(127, np.int32(np.rint(iscale * x[b * QK + 16 * g + j])))
                q[b * QK + 16 * g + j] = v
                s += v
            bsums[b * QK // 16 + g] = s
        d[b] = np.float32(1) / iscale


def _maddubs(builder, w, x):
    """pmaddubsw: <32 x i8> unsigned w times signed x, neighbouring products summed, <16 x i16>."""
    if _AVX2:
        return _call(builder, "llvm.x86.avx2.pmadd.ub.sw", _vec(_I16, 16), [w, x])
    prod = builder.mul(builder.zext(w, _vec(_I16, 32)), builder.sext(x, _vec(_I16, 32)))
    return _pair_sums(builder, prod)


def _maddwd(builder, a, b):
    """pmaddwd: <2n x i16> a times b, neighbouring products summed in int32, <n x i32>."""
    n = a.type.count
    if _AVX2 and n == 16:
        return _call(builder, "llvm.x86.avx2.pmadd.wd", _vec(_I32, 8), [a, b])
    prod = builder.mul(builder.sext(a, _vec(_I32, n)), builder.sext(b, _vec(_I32, n)))
    return _pair_sums(builder, prod)


def _pair_sums(builder, v):
    """Lane i = v[2i] + v[2i + 1]."""
    n = v.type.count
    return builder.add(*(builder.shuffle_vector(v, v, _const(_I32, range(k, n, 2))) for k in (0, 1)))


def _lanes(builder, v, first, count):
    return builder.shuffle_vector(v, v, _const(_I32, range(first, first + count)))


def _hsum8(builder, v):
    """llama.cpp's hsum_float_8: the halves added, then lanes (0 + 2) + (1 + 3)."""
    r = builder.fadd(_lanes(builder, v, 4, 4), _lanes(builder, v, 0, 4))
    return _hsum4(builder, r)


def _hsum4(builder, r):
    """(r0 + r2) + (r1 + r3), as _mm_movehl_ps then _mm_movehdup_ps."""
    e = lambda v, i: builder.extract_element(v, ir.Constant(_I32, i))  # noqa: E731
    return builder.fadd(builder.fadd(e(r, 0), e(r, 2)), builder.fadd(e(r, 1), e(r, 3)))


def _load_i16(builder, ptr, n):
    return builder.load(builder.bitcast(ptr, _vec(_I16, n).as_pointer()), align=2)


def _load32(builder, ptr):
    return builder.load(builder.bitcast(ptr, _vec(_I8, 32).as_pointer()), align=1)


def _accumulators(builder, count, vtype):
    return [cgutils.alloca_once_value(builder, ir.Constant(vtype, None)) for _ in range(count)]


def _super_blocks(builder, row, nbytes, block_bytes, add):
    """Loop over the super-blocks of a weight row: add(b, super-block pointer) for each."""
    with cgutils.for_range(builder, builder.udiv(nbytes, ir.Constant(nbytes.type, block_bytes))) as loop:
        b = loop.index
        add(b, builder.gep(row, [builder.mul(b, ir.Constant(b.type, block_bytes))]))


def q4_k_scales_mins(builder, sb):
    """The eight 6-bit scales then the eight mins of a Q4_K super-block, <16 x i16>: llama.cpp's utmp words
    (scales 0-3, scales 4-7, mins 0-3, mins 4-7 from the 12 packed bytes u0, u1, u2), all four at once."""
    i32x4 = _vec(_I32, 4)
    u = builder.load(builder.bitcast(_at(builder, sb, 4), i32x4.as_pointer()), align=1)  # u0 u1 u2 (+ a qs word)
    k1, k2, k3 = 0x3F3F3F3F, 0x0F0F0F0F, 0x03030303
    # words [u0 & k1, (u2 & k2) | ((u0 >> 6) & k3) << 4, u1 & k1, ((u2 >> 4) & k2) | ((u1 >> 6) & k3) << 4]
    picked = builder.shuffle_vector(u, u, _const(_I32, [0, 2, 1, 2]))
    low = builder.and_(builder.lshr(picked, _const(_I32, [0, 0, 0, 4])), _const(_I32, [k1, k2, k1, k2]))
    top = builder.and_(builder.lshr(builder.shuffle_vector(u, u, _const(_I32, [0, 0, 1, 1])), _const(_I32, [6] * 4)),
                       _const(_I32, [0, k3, 0, k3]))
    words = builder.or_(low, builder.shl(top, _const(_I32, [4] * 4)))
    return builder.zext(builder.bitcast(words, _vec(_I8, 16)), _vec(_I16, 16))


def q4_k_values(builder, sb):
    """A Q4_K super-block's unsigned 4-bit values as two lists of four <32 x i8>: run j's low nibbles (sub-block
    2j, weights 64j .. 64j + 31) and its high ones (sub-block 2j + 1, the next 32)."""
    low, high = [], []
    for j in range(4):
        q = _at(builder, sb, 16 + 32 * j)
        _prefetch(builder, q, PREFETCH_BYTES)
        packed = _load32(builder, q)
        low.append(builder.and_(packed, _const(_I8, [15] * 32)))
        high.append(builder.lshr(packed, _const(_I8, [4] * 32)))
    return low, high


def q6_k_values(builder, sb):
    """A Q6_K super-block's unsigned 6-bit values (q + 32) as eight <32 x i8>, its runs of 32 weights in order:
    per half of 128, the low or high nibbles of its two 32-byte runs of ql with two bits of qh on top."""
    runs = []
    for h in range(2):
        ql1, ql2 = _load32(builder, _at(builder, sb, 64 * h)), _load32(builder, _at(builder, sb, 64 * h + 32))
        _prefetch(builder, _at(builder, sb, 64 * h), PREFETCH_BYTES)
        qh = _load32(builder, _at(builder, sb, 128 + 32 * h))
        bytes_of = lambda v: _const(_I8, [v] * 32)  # noqa: E731
        low4 = lambda v: builder.and_(v, bytes_of(15))  # noqa: E731
        high4 = lambda v: builder.lshr(v, bytes_of(4))  # noqa: E731
        tops = (builder.shl(builder.and_(qh, bytes_of(3)), bytes_of(4)),
                builder.shl(builder.and_(qh, bytes_of(12)), bytes_of(2)),
                builder.and_(qh, bytes_of(48)),
                builder.lshr(builder.and_(qh, bytes_of(192)), bytes_of(2)))
        bottoms = (low4(ql1), low4(ql2), high4(ql1), high4(ql2))
        runs += [builder.or_(bottoms[p], tops[p]) for p in range(4)]
    return runs


def _q4_k_dots(builder, row, nbytes, inputs):
    """Per super-block: d = xd * d_w, dmin = -xd * dmin_w; sumi (8 int32 lanes) = sum over the four runs of
    64 weights of scale_lo * (low nibbles . x) + scale_hi * (high nibbles . x) (pmaddubsw, pmaddwd);
    acc += d * sumi; acc_m += dmin * (mins . sums of 32 of x) (4 lanes). The row's dot: hsum(acc) + hsum(acc_m)."""
    count = len(inputs)
    accs = _accumulators(builder, count, _F8)
    accs_m = _accumulators(builder, count, _F4)

    def add(b, sb):
        d_w, dmin_w = _f16(builder, sb), _f16(builder, _at(builder, sb, 2))
        scales_mins = q4_k_scales_mins(builder, sb)
        mins = _lanes(builder, scales_mins, 8, 8)
        scale = [builder.shuffle_vector(scales_mins, scales_mins, _const(_I32, [j] * 16)) for j in range(8)]
        low, high = q4_k_values(builder, sb)
        e = builder.mul(b, ir.Constant(b.type, 256))
        for t, (xq, xd, bsums) in enumerate(inputs):
            xd_b = builder.load(builder.gep(xd, [b]))
            d = builder.fmul(xd_b, d_w)
            dmin = builder.fmul(builder.fneg(xd_b), dmin_w)
            sums16 = _load_i16(builder, builder.gep(bsums, [builder.mul(b, ir.Constant(b.type, 16))]), 16)
            sums32 = _pair_sums(builder, sums16)
            prod = _maddwd(builder, mins, sums32)
            acc_m = accs_m[t]
            builder.store(multiply_add(builder, _splat(builder, dmin, 4), builder.sitofp(prod, _F4),
                                       builder.load(acc_m)), acc_m)
            sumi = ir.Constant(_vec(_I32, 8), None)
            for j in range(4):
                x_lo = _x32(builder, xq, builder.add(e, ir.Constant(e.type, 64 * j)))
                x_hi = _x32(builder, xq, builder.add(e, ir.Constant(e.type, 64 * j + 32)))
                p_lo = _maddwd(builder, scale[2 * j], _maddubs(builder, low[j], x_lo))
                p_hi = _maddwd(builder, scale[2 * j + 1], _maddubs(builder, high[j], x_hi))
                sumi = builder.add(sumi, builder.add(p_lo, p_hi))
            acc = accs[t]
            builder.store(multiply_add(builder, _splat(builder, d, 8), builder.sitofp(sumi, _F8),
                                       builder.load(acc)), acc)

    _super_blocks(builder, row, nbytes, 144, add)
    return [builder.fadd(_hsum8(builder, builder.load(acc)), _hsum4(builder, builder.load(acc_m)))
            for acc, acc_m in zip(accs, accs_m)]


def _q6_k_dots(builder, row, nbytes, inputs):
    """Per super-block: d = xd * d_w; sumi (8 int32 lanes) = sum over the eight runs of 32 weights of their
    two 16-weight groups' scales times (q . x) with q the unsigned 6-bit values, less 32 * (scales . sums of
    16 of x); acc += d * sumi. The row's dot: hsum(acc)."""
    count = len(inputs)
    accs = _accumulators(builder, count, _F8)

    def add(b, sb):
        d_w = _f16(builder, _at(builder, sb, 208))
        scales8 = builder.load(builder.bitcast(_at(builder, sb, 192), _vec(_I8, 16).as_pointer()), align=1)
        scales16 = builder.sext(scales8, _vec(_I16, 16))
        runs = []  # (values, group scales) of each run of 32 weights, in order
        for k, values in enumerate(q6_k_values(builder, sb)):
            group = 2 * k  # this run's two 16-weight groups
            pair = builder.shuffle_vector(scales8, scales8, _const(_I32, [group] * 8 + [group + 1] * 8))
            runs.append((values, builder.sext(pair, _vec(_I16, 16))))
        e = builder.mul(b, ir.Constant(b.type, 256))
        for t, (xq, xd, bsums) in enumerate(inputs):
            d = builder.fmul(builder.load(builder.gep(xd, [b])), d_w)
            sums16 = _load_i16(builder, builder.gep(bsums, [builder.mul(b, ir.Constant(b.type, 16))]), 16)
            offset = builder.shl(_maddwd(builder, sums16, scales16), _const(_I32, [5] * 8))
            sumi = ir.Constant(_vec(_I32, 8), None)
            products = [_maddwd(builder, scale, _maddubs(builder, q, _x32(builder, xq, builder.add(
                e, ir.Constant(e.type, 32 * k))))) for k, (q, scale) in enumerate(runs)]
            for k in range(0, 8, 2):
                sumi = builder.add(sumi, builder.add(products[k], products[k + 1]))
            sumi = builder.sub(sumi, offset)
            acc = accs[t]
            builder.store(multiply_add(builder, _splat(builder, d, 8), builder.sitofp(sumi, _F8),
                                       builder.load(acc)), acc)

    _super_blocks(builder, row, nbytes, 210, add)
    return [_hsum8(builder, builder.load(acc)) for acc in accs]


# input rows per pass over a super-block's unpacked weights: with AVX-512's 32 vector registers a tile of eight
# keeps them all in registers (an 8-row verify product 28% faster than two passes of four, measured on Q4_K)
_TILE_ROWS = 8 if _AVX512 else TILE

# rows_dot(w, r, xq, xd, bsums, out): out[n, r] = weight row r of w times input row n, for every row n of
# the Q8_K activations (xq int8 [m, cols], xd float32 [m, cols / 256], bsums int16 [m, cols / 16])
rows_dot_q4_k = _tiled(_q4_k_dots, _TILE_ROWS)
rows_dot_q6_k = _tiled(_q6_k_dots, _TILE_ROWS)
