"""A GGUF weight on the host: its raw bytes checked against its GGML type, and its rows decoded to float32.

A weight is a C-contiguous uint8 array [rows, row_bytes] (usually a view of the file's mmap) plus its GGML
type id. F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K and MXFP4 are decoded by the Numba block
decoders (quant_blocks); every other type `gguf.quants` can dequantize through it (quant_generic).
"""

from __future__ import annotations

import functools

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from kernels.common import formats
from kernels.common import quant_blocks as blocks
from kernels.common import quant_generic as generic


class UnsupportedQuantType(ValueError):
    """A GGML type that neither the native kernels nor gguf.quants can multiply."""


def has_native_kernel(qtype: int) -> bool:
    return qtype in blocks.NATIVE_TYPES


def supports(qtype: int) -> bool:
    """Whether this type can be decoded: natively, or by gguf.quants."""
    return has_native_kernel(qtype) or generic.supports(qtype)


def type_name(qtype: int) -> str:
    try:
        return GGMLQuantizationType(qtype).name
    except ValueError:
        return f"unknown type id {qtype}"


@functools.cache
def _block_geometry(qtype: int) -> tuple[int, int]:
    """(weights, bytes) per block, or UnsupportedQuantType."""
    if not supports(qtype):
        raise UnsupportedQuantType(
            f"GGML type {type_name(qtype)} has no CPU kernel and gguf.quants cannot dequantize it"
        )
    return GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]


def _readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view: mmapped weights are read-only, so every array reaches Numba as one type."""
    if not a.flags.writeable:
        return a
    v = a.view()
    v.flags.writeable = False
    return v


def checked(qtype: int, w: np.ndarray) -> tuple[np.ndarray, int]:
    """Checked weight (read-only view) and its column count."""
    block_elems, block_bytes = _block_geometry(qtype)
    if not isinstance(w, np.ndarray) or w.dtype != np.uint8 or w.ndim != 2:
        shape, dtype = getattr(w, "shape", None), getattr(w, "dtype", type(w).__name__)
        raise ValueError(
            f"a {type_name(qtype)} weight must be a uint8 [rows, row_bytes] array, got {dtype} with shape {shape}"
        )
    if not w.flags.c_contiguous:
        raise ValueError(f"a {type_name(qtype)} weight must be C-contiguous (shape {w.shape}, strides {w.strides})")
    if w.shape[1] % block_bytes:
        raise ValueError(
            f"a {type_name(qtype)} weight of shape {w.shape} has rows of {w.shape[1]} bytes, "
            f"not a whole number of {block_bytes}-byte blocks"
        )
    return _readonly(w), w.shape[1] // block_bytes * block_elems


def _row_range(w: np.ndarray, start: int, stop: int | None) -> tuple[int, int]:
    rows = w.shape[0]
    stop = rows if stop is None else stop
    if not 0 <= start <= stop <= rows:
        raise ValueError(f"row range [{start}, {stop}) is outside a weight of shape {w.shape}")
    return start, stop


def dequantize(qtype: int, w: np.ndarray, row_start: int = 0, row_stop: int | None = None) -> np.ndarray:
    """Rows row_start..row_stop as float32 [rows, cols]."""
    w, cols = checked(qtype, w)
    start, stop = _row_range(w, row_start, row_stop)
    return decode(qtype, w, np.arange(start, stop, dtype=np.int64), cols)


def decode(qtype: int, w: np.ndarray, ids: np.ndarray, cols: int) -> np.ndarray:
    """W[ids] as float32 [len(ids), cols] (w checked)."""
    if not has_native_kernel(qtype):
        return generic.dequantize_rows(qtype, w[ids])
    out = np.empty((ids.shape[0], cols), np.float32)
    blocks.decode_rows(formats.of([qtype]), qtype, w, ids, out, blocks.N16)
    return out
