"""Whether a model file's stored floating-point numbers are all finite.

A NaN or Inf in a weight does not always reach the logits: the quantized matvecs quantize their input to
int8 per block, which turns a NaN activation into an arbitrary finite value, so a broken file would answer
with garbage (often an immediate end-of-text) instead of failing. Checking the file's floats at load
catches it. Quantized formats hold their floats in per-block f16 scales (ggml's block layouts: the
integer sub-scales and quants are finite by construction); float tensors are checked whole.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from engine.errors import GGUFError
from engine.gguf.reader import GGUFFile

# format -> (byte offset of its f16 scales in a block, how many)
_F16_SCALES = {
    T.Q4_0: (0, 1), T.Q4_1: (0, 2), T.Q5_0: (0, 1), T.Q5_1: (0, 2), T.Q8_0: (0, 1),
    T.Q2_K: (80, 2), T.Q3_K: (108, 1), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208, 1),
    T.IQ1_S: (0, 1), T.IQ2_XXS: (0, 1), T.IQ2_XS: (0, 1), T.IQ2_S: (0, 1), T.IQ3_XXS: (0, 1), T.IQ3_S: (0, 1),
    T.IQ4_NL: (0, 1), T.IQ4_XS: (0, 1), T.TQ1_0: (52, 1), T.TQ2_0: (64, 1),
}
_CHUNK_BYTES = 1 << 22  # read at a time: the scan's memory stays small


def first_non_finite(file: GGUFFile) -> str | None:
    """The name of the first tensor that stores a NaN or Inf, or None. The scan reads the file rather
    than its mapping, so it leaves no weight pages resident in the process (most of an embedding table
    is never touched while serving)."""
    with open(file.path, "rb") as f:
        for info in file.tensors.values():
            row_bytes = info.nbytes // (int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1)
            chunk = max(1, _CHUNK_BYTES // row_bytes) * row_bytes
            f.seek(info.offset)
            for start in range(0, info.nbytes, chunk):
                data = f.read(min(chunk, info.nbytes - start))
                if len(data) % row_bytes:  # the file shrank since it was opened
                    raise GGUFError(f"{file.path}: tensor {info.name!r} ends early; the file changed while loading")
                if not all_finite(info.ggml_type, np.frombuffer(data, np.uint8).reshape(-1, row_bytes)):
                    return info.name
    return None


def all_finite(ggml_type: int, raw: np.ndarray) -> bool:
    """False when whole rows of a tensor's bytes (uint8 [rows, row_bytes]) store a NaN or Inf; formats
    whose scales are not f16 fields (IQ1_M, MXFP4) count as finite."""
    if ggml_type == T.F32:
        return bool(np.isfinite(raw.view(np.float32)).all())
    if ggml_type == T.F16:
        return bool(np.isfinite(raw.view(np.float16)).all())
    if ggml_type == T.BF16:  # exponent all ones: Inf or NaN
        return not ((raw.view(np.uint16) & 0x7F80) == 0x7F80).any()
    if ggml_type in _F16_SCALES:
        offset, count = _F16_SCALES[ggml_type]
        blocks = raw.reshape(-1, GGML_QUANT_SIZES[T(ggml_type)][1])
        return bool(np.isfinite(blocks[:, offset : offset + 2 * count].view(np.float16)).all())
    return True
