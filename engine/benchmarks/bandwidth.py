"""What decode is racing against: the bytes of weights one token reads, and how fast this machine reads memory.

Past a few hundred million parameters a decode step streams every weight once, so its speed is bounded by
bytes per token / read bandwidth. The benchmark reports both beside its tokens per second, measured in the same
run (the bandwidth of a shared machine changes by the minute).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from engine.gguf.reader import open_gguf
from engine.models.footprint import footprint, is_experts

_EMBEDDING, _OUTPUT = "token_embd.weight", "output.weight"


def weight_bytes_per_token(path: str | os.PathLike) -> int:
    """Bytes of tensors a decode step reads: all of them but the embedding table, of which it reads one row,
    or all of it where the output product reuses it (tied embeddings); of a Mixture-of-Experts model's
    experts, the k of n a token is routed to in every layer."""
    with open_gguf(path) as f:
        tensors = f.tensors
        total = sum(t.nbytes for name, t in tensors.items() if name != _EMBEDDING and not is_experts(name))
        total += footprint(f).active_expert_bytes
        embedding = tensors.get(_EMBEDDING)
        if embedding is not None:
            total += embedding.nbytes if _OUTPUT not in tensors else embedding.nbytes // embedding.shape[0]
    return total


def read_bandwidth_gbs(threads: int, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """The best rate, in GB/s, at which `threads` threads sum an array of `nbytes` (larger than the caches),
    each its own contiguous share (NumPy's reductions release the GIL)."""
    values = np.ones(nbytes // 4, np.float32)  # written once, so every page is resident
    shares = np.array_split(values, threads)
    best = 0.0
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            t0 = time.perf_counter()
            list(pool.map(np.sum, shares))
            best = max(best, values.nbytes / (time.perf_counter() - t0) / 1e9)
    return best
