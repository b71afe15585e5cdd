"""A float32 exp that LLVM vectorizes.

`np.exp` and `np.tanh` inside Numba loops become one libm call per element (no
vector math library here), which made the gated activations of a 512-token
prefill cost as much as a third of its matrix products. This is Cephes' expf:
a range reduction by ln 2, a degree-6 polynomial (relative error ~1e-7) and the
power of two assembled in the exponent bits, all plain vector arithmetic. Below -87 it is 0, as expf rounds
there within float32's normal range: no subnormal results, which multiply many times slower on some CPUs
(a peaked softmax over many keys leaves most of its weights there).
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

_LOG2E = np.float32(1.44269504088896341)
_LN2_HI, _LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)
_P0, _P1, _P2 = np.float32(1.9875691500e-4), np.float32(1.3981999507e-3), np.float32(8.3334519073e-3)
_P3, _P4, _P5 = np.float32(4.1665795894e-2), np.float32(1.6666665459e-1), np.float32(5.0000001201e-1)
# exp saturates above _HI (2**127 stays a normal float) and is 0 below _LO (2**-126 is the smallest normal)
_LO, _HI = np.float32(-87.0), np.float32(88.0)


@intrinsic
def _f32_from_bits(typingctx, bits):
    """uint32 bit pattern -> float32."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


@njit(cache=True, inline="always")
def exp32(x):
    vanishes = x < _LO
    x = min(max(x, _LO), _HI)
    n = np.floor(x * _LOG2E + np.float32(0.5))
    r = x - n * _LN2_HI - n * _LN2_LO
    p = ((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5
    p = p * r * r + r + np.float32(1)
    scale = _f32_from_bits(np.left_shift(np.uint32(np.int32(n) + np.int32(127)), np.uint32(23)))
    return np.float32(0) if vanishes else p * scale
