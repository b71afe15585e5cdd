"""KV rows into their storage form (kernels.backend): the bytes every backend's cache keeps for a position."""

import numpy as np

from kernels.common import q8_0


def encode(dtype: str, rows: np.ndarray) -> np.ndarray:
    """float32 rows [..., head_dim] as f16 bit patterns (uint16) or q8_0 blocks (uint8 [..., head_dim / 32 * 34])."""
    if dtype == "f16":
        return rows.astype(np.float16).view(np.uint16)
    return q8_0.quantize(rows)
