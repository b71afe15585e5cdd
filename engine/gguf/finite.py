"""Whether a tensor's stored floating-point numbers are all finite.

A NaN or Inf in a weight does not always reach the logits: the quantized matvecs quantize their input to
int8 per block, which turns a NaN activation into an arbitrary finite value, so a broken file would answer
with garbage (often an immediate end-of-text) instead of failing. Checking the file's floats at load
catches it. Quantized formats hold their floats in per-block f16 scales (ggml's block layouts: the
integer sub-scales and quants are finite by construction); float tensors are checked whole.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

# format -> (byte offset of its f16 scales in a block, how many)
_F16_SCALES = {
    T.Q4_0: (0, 1), T.Q4_1: (0, 2), T.Q5_0: (0, 1), T.Q5_1: (0, 2), T.Q8_0: (0, 1),
    T.Q2_K: (80, 2), T.Q3_K: (108, 1), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208, 1),
    T.IQ1_S: (0, 1), T.IQ2_XXS: (0, 1), T.IQ2_XS: (0, 1), T.IQ2_S: (0, 1), T.IQ3_XXS: (0, 1), T.IQ3_S: (0, 1),
    T.IQ4_NL: (0, 1), T.IQ4_XS: (0, 1), T.TQ1_0: (52, 1), T.TQ2_0: (64, 1),
}
_CHUNK_BYTES = 1 << 24  # rows checked at a time: the temporaries stay small on a large float tensor


def all_finite(ggml_type: int, raw: np.ndarray) -> bool:
    """False when a tensor's bytes (GGUFFile.raw) store a NaN or Inf; formats whose scales are not f16
    fields (IQ1_M, MXFP4) count as finite."""
    rows = max(1, _CHUNK_BYTES // raw.shape[1])
    return all(_chunk_finite(ggml_type, raw[r : r + rows]) for r in range(0, raw.shape[0], rows))


def _chunk_finite(ggml_type: int, raw: np.ndarray) -> bool:
    if ggml_type == T.F32:
        return bool(np.isfinite(raw.view(np.float32)).all())
    if ggml_type == T.F16:
        return bool(np.isfinite(raw.view(np.float16)).all())
    if ggml_type == T.BF16:  # exponent all ones: Inf or NaN
        return not ((raw.view(np.uint16) & 0x7F80) == 0x7F80).any()
    if ggml_type in _F16_SCALES:
        offset, count = _F16_SCALES[ggml_type]
        block_bytes = GGML_QUANT_SIZES[T(ggml_type)][1]
        blocks = raw.reshape(-1, block_bytes)
        return bool(np.isfinite(blocks[:, offset : offset + 2 * count].view(np.float16)).all())
    return True
