"""Decode attention for many queries of one kv head at once, the queries side by side in vector lanes.

`attention.decode_heads` takes one query head at a time: its q . k has its 16 partial sums in vector
lanes, reduced per key, and every head widens again the keys and values its kv head shares with the
rest of its group. A verify step of m rows gives a kv head m x group queries; here up to 16 of them
share each key and value row: lane l holds query l, each element of the key is broadcast to all lanes.

The arithmetic of a query is decode_heads' own, step for step: the same 16 partial sums of q . k (phase
p adds the elements c with c % 16 == p, as fused multiply-adds in order of c), combined the same way
(phase p with phase p + 8, then those eight in order), the same softmax, the same products and sums over
the values in order of key. So a query's bits depend neither on the kernel that ran it nor on the
queries beside it, and `attend_rows` picks the kernel by speed alone.
"""

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from kernels.common.quant_blocks import KERNEL
from kernels.cpu.attention import decode_rows
from kernels.cpu.fast_exp import exp32
from kernels.cpu.int8_dot import multiply_add
from kernels.cpu.int_gemm import _splat

LANES = 16
_F32 = ir.FloatType()
_FVEC = ir.VectorType(_F32, LANES)
_I32 = ir.IntType(32)
# fewer queries per kv head than this run one head at a time: below it the lanes are mostly empty (and a
# one-row decode keeps the head-by-head kernel for all three starter models: 3, 4 and 7 heads a group)
LANES_MIN_QUERIES = 8
# queries whose sums over the values advance together (one widened value chunk serves them all)
_VALUE_QUERIES = 8
# the widest head the lanes take (their key buffer is this long): a latent attention row, 512 + 64 RoPE dims
MAX_HEAD_DIM = 576


def _element_ptr(context, builder, ary, aryty, indices):
    shape = cgutils.unpack_tuple(builder, ary.shape, aryty.ndim)
    strides = cgutils.unpack_tuple(builder, ary.strides, aryty.ndim)
    return cgutils.get_item_pointer2(context, builder, ary.data, shape, strides, aryty.layout, indices)


def _widen(builder, ptr, element_type, n):
    """n consecutive cache elements at ptr (f16 bits or float32) as <n x float>."""
    if element_type == types.float32:
        return builder.load(builder.bitcast(ptr, ir.VectorType(_F32, n).as_pointer()), align=4)
    half = builder.load(builder.bitcast(ptr, ir.VectorType(ir.HalfType(), n).as_pointer()), align=2)
    return builder.fpext(half, ir.VectorType(_F32, n))


def _lane_args(kv):
    return isinstance(kv, types.Array) and kv.ndim == 3 and kv.layout == "C" and kv.dtype in (types.float32,
                                                                                               types.uint16)


@intrinsic
def _lane_scores(typingctx, qt, k, kvh, j0, j1, scale, s):
    """s[j - j0, l] = scale * (query l . k[j, kvh]) for keys j0 <= j < j1, queries qt [head_dim, 16]
    (float32, query l in lane l), head_dim a multiple of 16; k f16 bits or float32."""
    if not _lane_args(k):
        return None

    def codegen(context, builder, sig, args):
        qt_a, k_a, s_a = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 1, 6))
        kvh_v, j0_v, j1_v, scale_v = args[2], args[3], args[4], args[5]
        hd = cgutils.unpack_tuple(builder, qt_a.shape, 2)[0]
        zero = ir.Constant(hd.type, 0)
        # the key widened once, then broadcast element by element from here
        key = cgutils.alloca_once(builder, _F32, size=ir.Constant(ir.IntType(64), MAX_HEAD_DIM))
        phases = [cgutils.alloca_once(builder, _FVEC) for _ in range(LANES)]
        chunks = builder.udiv(hd, ir.Constant(hd.type, LANES))
        with cgutils.for_range(builder, builder.sub(j1_v, j0_v)) as keys:
            j = builder.add(j0_v, keys.index)
            row = _element_ptr(context, builder, k_a, sig.args[1], [j, kvh_v, zero])
            with cgutils.for_range(builder, chunks) as loop:
                c = builder.mul(loop.index, ir.Constant(hd.type, LANES))
                builder.store(_widen(builder, builder.gep(row, [c]), sig.args[1].dtype, LANES),
                              builder.bitcast(builder.gep(key, [c]), _FVEC.as_pointer()), align=4)
            for acc in phases:
                builder.store(ir.Constant(_FVEC, None), acc)
            with cgutils.for_range(builder, chunks) as loop:
                for p, acc in enumerate(phases):
                    c = builder.add(builder.mul(loop.index, ir.Constant(hd.type, LANES)), ir.Constant(hd.type, p))
                    q = builder.load(builder.bitcast(_element_ptr(context, builder, qt_a, sig.args[0], [c, zero]),
                                                     _FVEC.as_pointer()), align=4)
                    kc = _splat(builder, builder.load(builder.gep(key, [c])), LANES)
                    builder.store(multiply_add(builder, q, kc, builder.load(acc)), acc)
            total = ir.Constant(_FVEC, None)
            for p in range(LANES // 2):  # decode_heads' reduction: ((0 + (p0 + p8)) + (p1 + p9)) + ...
                total = builder.fadd(total, builder.fadd(builder.load(phases[p]), builder.load(phases[p + 8])))
            total = builder.fmul(total, _splat(builder, scale_v, LANES))
            out = _element_ptr(context, builder, s_a, sig.args[6], [keys.index, zero])
            builder.store(total, builder.bitcast(out, _FVEC.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(qt, k, kvh, j0, j1, scale, s), codegen


@intrinsic
def _lane_values(typingctx, p, v, kvh, j0, j1, lanes, out):
    """out[l] = sum over keys j0 <= j < j1, in order, of p[j - j0, l] * v[j, kvh] (a multiply, then an add,
    as decode_heads does) for lanes l < `lanes`; head_dim a multiple of 16; v f16 bits or float32."""
    if not _lane_args(v):
        return None

    def codegen(context, builder, sig, args):
        p_a, v_a, out_a = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 1, 6))
        kvh_v, j0_v, j1_v, lanes_v = args[2], args[3], args[4], args[5]
        hd = cgutils.unpack_tuple(builder, out_a.shape, 2)[1]
        accs = [cgutils.alloca_once(builder, _FVEC) for _ in range(_VALUE_QUERIES)]
        groups = builder.udiv(builder.add(lanes_v, ir.Constant(hd.type, _VALUE_QUERIES - 1)),
                              ir.Constant(hd.type, _VALUE_QUERIES))
        with cgutils.for_range(builder, builder.udiv(hd, ir.Constant(hd.type, LANES))) as chunk:
            c = builder.mul(chunk.index, ir.Constant(hd.type, LANES))
            with cgutils.for_range(builder, groups) as group:
                l0 = builder.mul(group.index, ir.Constant(hd.type, _VALUE_QUERIES))
                for acc in accs:
                    builder.store(ir.Constant(_FVEC, None), acc)
                with cgutils.for_range(builder, builder.sub(j1_v, j0_v)) as keys:
                    j = builder.add(j0_v, keys.index)
                    value = _widen(builder, _element_ptr(context, builder, v_a, sig.args[1], [j, kvh_v, c]),
                                   sig.args[1].dtype, LANES)
                    weights = _element_ptr(context, builder, p_a, sig.args[0], [keys.index, l0])
                    for t, acc in enumerate(accs):
                        w = _splat(builder, builder.load(builder.gep(weights, [ir.Constant(hd.type, t)])), LANES)
                        builder.store(builder.fadd(builder.load(acc), builder.fmul(w, value)), acc)
                for t, acc in enumerate(accs):
                    lane = builder.add(l0, ir.Constant(hd.type, t))
                    with builder.if_then(builder.icmp_unsigned("<", lane, lanes_v)):
                        dst = _element_ptr(context, builder, out_a, sig.args[6], [lane, c])
                        builder.store(builder.load(acc), builder.bitcast(dst, _FVEC.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(p, v, kvh, j0, j1, lanes, out), codegen


@njit(parallel=True, **KERNEL)
def attend_lanes(q, k, v, n_keys, window, scale, sinks, out):
    """out [m, heads, d] = attention of the query rows q [m, heads, d] of one cache, row i over cache rows
    [0, n_keys[i]) of k, v [positions, kv_heads, d] (f16 bits or float32), d a multiple of 16; sinks [heads]
    (or empty): each head's logit in the softmax's denominator. Each kv head's m x group queries go 16 to a
    vector (row-major, then head), the vectors split over threads."""
    m, n_head, d = q.shape
    n_kv = k.shape[1]
    group = n_head // n_kv
    per_kv = m * group
    vectors = (per_kv + LANES - 1) // LANES
    for task in prange(n_kv * vectors):
        kvh, first = task // vectors, task % vectors * LANES
        lanes = min(LANES, per_kv - first)
        qt = np.zeros((d, LANES), np.float32)
        lo = np.zeros(LANES, np.int64)
        hi = np.zeros(LANES, np.int64)
        j0, j1 = n_keys[m - 1], 0
        for t in range(lanes):
            row, h = (first + t) // group, kvh * group + (first + t) % group
            for c in range(d):
                qt[c, t] = q[row, h, c]
            hi[t] = n_keys[row]
            lo[t] = hi[t] - window if window > 0 and hi[t] > window else 0
            j0, j1 = min(j0, lo[t]), max(j1, hi[t])
        s = np.empty((j1 - j0, LANES), np.float32)
        _lane_scores(qt, k, kvh, j0, j1, scale, s)
        # each lane's softmax over its own keys; out of its range a lane's weight is 0, which adds nothing
        # (the lane loops are branch-free selects, so they run as vectors)
        top = np.full(LANES, -np.inf, np.float32)
        for j in range(j1 - j0):
            for t in range(LANES):
                seen = (lo[t] <= j0 + j) & (j0 + j < hi[t])
                x = s[j, t] if seen else np.float32(-np.inf)
                top[t] = x if x > top[t] else top[t]
        if sinks.size:
            for t in range(lanes):
                top[t] = max(top[t], sinks[kvh * group + (first + t) % group])
        total = np.zeros(LANES, np.float32)
        for j in range(j1 - j0):
            for t in range(LANES):
                seen = (lo[t] <= j0 + j) & (j0 + j < hi[t])
                e = exp32(s[j, t] - top[t])
                e = e if seen else np.float32(0)
                s[j, t] = e
                total[t] += e
        if sinks.size:
            for t in range(lanes):
                total[t] += exp32(sinks[kvh * group + (first + t) % group] - top[t])
        acc = np.empty((LANES, d), np.float32)
        _lane_values(s, v, kvh, j0, j1, lanes, acc)
        for t in range(lanes):
            row, h = (first + t) // group, kvh * group + (first + t) % group
            inv = np.float32(1.0) / total[t]
            for c in range(d):
                out[row, h, c] = acc[t, c] * inv


@njit(**KERNEL)
def attend_rows(q, k, v, n_keys, window, scale, sinks, out):
    """out [m, heads, d] = attention of the query rows q [m, heads, d] of one cache (row i over its first
    n_keys[i] rows): side by side in lanes when there are enough queries per kv head, else head by head;
    the bits are the same either way."""
    m, n_head, d = q.shape
    if d % LANES == 0 and d <= MAX_HEAD_DIM and m * (n_head // k.shape[1]) >= LANES_MIN_QUERIES:
        attend_lanes(q, k, v, n_keys, window, scale, sinks, out)
    else:
        decode_rows(q, k, v, n_keys, window, scale, sinks, out)
