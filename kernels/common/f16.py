"""Half-precision conversions for Numba kernels.

Numba has no float16 type, so f16 data travels as uint16 bit patterns. These
intrinsics emit LLVM's `fpext half`/`fptrunc half` directly: exact IEEE
conversions (subnormals, inf, NaN) that LLVM lowers to F16C instructions and
vectorizes inside loops — far faster than bit twiddling or a lookup table.
"""

from llvmlite import ir
from numba import types
from numba.extending import intrinsic


@intrinsic
def f16_bits_to_f32(typingctx, bits):
    """uint16 IEEE half bit pattern -> float32 (exact)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def f32_to_f16_bits(typingctx, value):
    """float32 -> uint16 IEEE half bit pattern (round to nearest even, as NumPy)."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen
