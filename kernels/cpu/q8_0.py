"""Q8_0 row quantization for the KV cache: blocks of 32 values as one f16 scale + 32 int8.

Byte-compatible with GGML's block_q8_0 (and its reference rounding), so a q8_0
cache row is exactly what llama.cpp's `--cache-type-k q8_0` stores.
"""

import numpy as np

BLOCK = 32
BLOCK_BYTES = 2 + BLOCK


def quantize(x: np.ndarray) -> np.ndarray:
    """float32 [..., d] (d % 32 == 0) -> uint8 [..., d // 32 * 34]."""
    *lead, d = x.shape
    blocks = x.reshape(-1, BLOCK).astype(np.float32, copy=False)
    amax = np.abs(blocks).max(axis=1)
    scale = amax / np.float32(127.0)
    inv = np.divide(np.float32(1.0), scale, out=np.zeros_like(scale), where=scale != 0)
    scaled = blocks * inv[:, None]
    q = np.trunc(scaled + np.copysign(np.float32(0.5), scaled)).astype(np.int8)  # roundf: half away from zero
    out = np.empty((blocks.shape[0], BLOCK_BYTES), dtype=np.uint8)
    out[:, :2] = scale.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(*lead, d // BLOCK * BLOCK_BYTES)


def dequantize(blocks: np.ndarray) -> np.ndarray:
    """uint8 [..., nb * 34] -> float32 [..., nb * 32]."""
    *lead, nbytes = blocks.shape
    b = np.ascontiguousarray(blocks).reshape(-1, BLOCK_BYTES)
    scale = b[:, :2].copy().view(np.float16).astype(np.float32)
    q = b[:, 2:].view(np.int8).astype(np.float32)
    return (q * scale).reshape(*lead, nbytes // BLOCK_BYTES * BLOCK)
