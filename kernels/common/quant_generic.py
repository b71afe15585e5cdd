"""Every GGML type without a native kernel (IQ*, TQ*, MXFP4, ...): `gguf.quants` dequantizes row tiles."""

import functools

import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

# Integer tensors hold indices or counts, not weights to multiply.
_INTEGER_TYPES = frozenset(
    (GGMLQuantizationType.I8, GGMLQuantizationType.I16, GGMLQuantizationType.I32, GGMLQuantizationType.I64)
)


@functools.cache
def supports(qtype: int) -> bool:
    """Whether gguf.quants can dequantize this type (probed once on a zero block)."""
    try:
        gtype = GGMLQuantizationType(qtype)
    except ValueError:
        return False
    if gtype in _INTEGER_TYPES or gtype not in GGML_QUANT_SIZES:
        return False
    try:
        quants.dequantize(np.zeros((1, GGML_QUANT_SIZES[gtype][1]), np.uint8), gtype)
    except NotImplementedError:
        return False
    return True


def dequantize_rows(qtype: int, w: np.ndarray) -> np.ndarray:
    """uint8 [rows, row_bytes] -> float32 [rows, cols]."""
    gtype = GGMLQuantizationType(qtype)
    if w.shape[0] == 0:  # gguf.quants cannot reshape an empty tensor
        block_elems, block_bytes = GGML_QUANT_SIZES[gtype]
        return np.empty((0, w.shape[1] // block_bytes * block_elems), np.float32)
    return np.asarray(quants.dequantize(w, gtype), dtype=np.float32)
