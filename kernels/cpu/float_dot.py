"""A float dot product in a fixed order (the attention scores of decode), and the weighted row sum beside it
(its values).

Without fast-math reassociation (see quant_blocks.KERNEL) LLVM keeps a float sum
in source order and cannot vectorize it, and a one-lane chain of adds made the
q . k scores of decode several times slower. Here the order is spelled out
instead: two 8-lane vector accumulators over alternating 8-element chunks (fused
multiply-adds where the host has FMA), added lane by lane, then reduced lane 0
first (an ordered `llvm.vector.reduce.fadd`).
Every compilation computes the same bits, and the loads and multiplies run as
AVX vectors. The second operand may be f16 bit patterns (the default KV cache)
or float32.
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from kernels.common.f16 import f16_bits_to_f32
from kernels.common.quant_blocks import KERNEL
from kernels.cpu.int8_dot import multiply_add
from kernels.cpu.int_gemm import _splat

_LANES = 8
_F32 = ir.FloatType()
_FVEC = ir.VectorType(_F32, _LANES)


def as_f32(x):
    """Widen one float32 or f16-bits element to float32 (Numba-only; specialised per element type)."""
    raise NotImplementedError


@overload(as_f32, inline="always")
def _as_f32_overload(x):
    if x == types.uint16:
        return lambda x: f16_bits_to_f32(x)
    return lambda x: np.float32(x)


def _chunk(builder, data, element_type, start):
    """The 8 elements of a float32 or f16-bits array from index `start`, as <8 x float>."""
    ptr = builder.gep(data, [start])
    if element_type == types.float32:
        return builder.load(builder.bitcast(ptr, _FVEC.as_pointer()), align=4)
    half = builder.load(builder.bitcast(ptr, ir.VectorType(ir.HalfType(), _LANES).as_pointer()), align=2)
    return builder.fpext(half, _FVEC)


@intrinsic
def _dot_chunks(typingctx, a, b):
    """sum a[i] * b[i] over the first len(a) // 16 * 16 elements, in the fixed order above."""
    if not (isinstance(a, types.Array) and isinstance(b, types.Array) and a.ndim == b.ndim == 1
            and a.dtype == types.float32 and b.dtype in (types.float32, types.uint16)
            and a.layout == b.layout == "C"):
        return None

    def codegen(context, builder, sig, args):
        arr_a, arr_b = (context.make_array(t)(context, builder, v) for t, v in zip(sig.args, args))
        (n,) = cgutils.unpack_tuple(builder, arr_a.shape, 1)
        accs = [cgutils.alloca_once_value(builder, ir.Constant(_FVEC, None)) for _ in range(2)]
        step = ir.Constant(n.type, 2 * _LANES)
        with cgutils.for_range(builder, builder.udiv(n, step)) as loop:
            for lane_block, acc in enumerate(accs):
                start = builder.add(builder.mul(loop.index, step), ir.Constant(n.type, lane_block * _LANES))
                builder.store(multiply_add(builder, _chunk(builder, arr_a.data, sig.args[0].dtype, start),
                                           _chunk(builder, arr_b.data, sig.args[1].dtype, start),
                                           builder.load(acc)), acc)
        total = builder.fadd(builder.load(accs[0]), builder.load(accs[1]))
        reduce = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32, _FVEC]),
                                                f"llvm.vector.reduce.fadd.v{_LANES}f32")
        return builder.call(reduce, [ir.Constant(_F32, 0.0), total])  # no fast-math flags: ordered

    return types.float32(a, b), codegen


@njit(**KERNEL, inline="always")
def dot(a, b):
    """a . b for contiguous rows of equal length: a float32, b float32 or f16 bits. Elements past the
    last multiple of 16 are added one by one, in order."""
    total = _dot_chunks(a, b)
    for i in range(a.shape[0] // 16 * 16, a.shape[0]):
        total += a[i] * as_f32(b[i])
    return total


@intrinsic
def _accumulate_chunks(typingctx, acc, p, row):
    """acc[i] = acc[i] + p * row[i] (a multiply, then an add) over the first len(acc) // 8 * 8 elements, 8 at a
    time: each element's own chain, so the same bits as one element at a time."""
    if not (isinstance(acc, types.Array) and isinstance(row, types.Array) and acc.ndim == row.ndim == 1
            and acc.dtype == types.float32 and p == types.float32 and row.dtype in (types.float32, types.uint16)
            and acc.layout == row.layout == "C"):
        return None

    def codegen(context, builder, sig, args):
        arr_acc, arr_row = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 2))
        (n,) = cgutils.unpack_tuple(builder, arr_acc.shape, 1)
        weight = _splat(builder, args[1], _LANES)
        step = ir.Constant(n.type, _LANES)
        with cgutils.for_range(builder, builder.udiv(n, step)) as loop:
            start = builder.mul(loop.index, step)
            ptr = builder.bitcast(builder.gep(arr_acc.data, [start]), _FVEC.as_pointer())
            value = _chunk(builder, arr_row.data, sig.args[2].dtype, start)
            builder.store(builder.fadd(builder.load(ptr, align=4), builder.fmul(weight, value)), ptr, align=4)
        return context.get_dummy_value()

    return types.none(acc, p, row), codegen


@njit(**KERNEL, inline="always")
def accumulate(acc, p, row):
    """acc += p * row for contiguous rows of equal length: acc float32, p a float32, row float32 or f16 bits;
    per element a multiply, then an add (no fused multiply-add), in any grouping the same bits."""
    _accumulate_chunks(acc, p, row)
    for i in range(acc.shape[0] // _LANES * _LANES, acc.shape[0]):
        acc[i] += p * as_f32(row[i])
