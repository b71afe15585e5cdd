"""Per-layer post-RoPE key/value store for autoregressive decoding (spec 13.4).

Each layer holds one preallocated [capacity, kv_heads, head_dim] array for K and
one for V. f16 (default) rows are stored as uint16 bit patterns, which the
attention kernels widen in-register; q8_0 rows as GGML block_q8_0 bytes. The
cache has no window logic: windowed models mask at read time, which keeps
`truncate` (the rewind primitive) a single integer store.
"""

from __future__ import annotations

from enum import Enum
from typing import Sequence

import numpy as np

from engine.errors import KvCacheHeadDimNotBlockAligned, KvCacheOverflow, KvCacheShapeMismatch
from kernels.cpu import q8_0


class KvDtype(str, Enum):
    F16 = "f16"
    Q8_0 = "q8_0"


class KvCache:
    def __init__(self, kv_heads: Sequence[int], head_dims: Sequence[int], capacity: int,
                 dtype: KvDtype | str = KvDtype.F16):
        if len(kv_heads) != len(head_dims):
            raise KvCacheShapeMismatch(f"{len(kv_heads)} kv_heads entries but {len(head_dims)} head_dims entries")
        if capacity <= 0:
            raise KvCacheShapeMismatch(f"capacity must be positive, got {capacity}")
        self.dtype = KvDtype(dtype)
        self.kv_heads = tuple(int(h) for h in kv_heads)
        self.head_dims = tuple(int(d) for d in head_dims)
        self.capacity = int(capacity)
        self.len = 0
        if self.dtype is KvDtype.Q8_0:
            bad = [d for d in self.head_dims if d % q8_0.BLOCK]
            if bad:
                raise KvCacheHeadDimNotBlockAligned(
                    f"a q8_0 KV cache needs head_dim to be a multiple of {q8_0.BLOCK}; this model has {bad[0]}"
                )
        self.k = [self._alloc(h, d) for h, d in zip(self.kv_heads, self.head_dims)]
        self.v = [self._alloc(h, d) for h, d in zip(self.kv_heads, self.head_dims)]

    @classmethod
    def uniform(cls, n_layers: int, kv_heads: int, head_dim: int, capacity: int,
                dtype: KvDtype | str = KvDtype.F16) -> "KvCache":
        return cls([kv_heads] * n_layers, [head_dim] * n_layers, capacity, dtype)

    def _alloc(self, kv_heads: int, head_dim: int) -> np.ndarray:
        if self.dtype is KvDtype.F16:
            return np.zeros((self.capacity, kv_heads, head_dim), dtype=np.uint16)
        return np.zeros((self.capacity, kv_heads, head_dim // q8_0.BLOCK * q8_0.BLOCK_BYTES), dtype=np.uint8)

    @property
    def n_layers(self) -> int:
        return len(self.k)

    def geometry(self) -> tuple:
        return (self.dtype.value, self.kv_heads, self.head_dims)

    def _encode(self, rows: np.ndarray) -> np.ndarray:
        if self.dtype is KvDtype.F16:
            return rows.astype(np.float16).view(np.uint16)
        return q8_0.quantize(rows)

    def append_layer(self, layer: int, k_rows: np.ndarray, v_rows: np.ndarray) -> None:
        """Write f32 rows [m, kv_heads, head_dim] at offset len. Does not advance: call
        advance(m) once after every layer has been written."""
        want = (self.kv_heads[layer], self.head_dims[layer])
        for name, rows in (("K", k_rows), ("V", v_rows)):
            if rows.ndim != 3 or rows.shape[1:] != want:
                raise KvCacheShapeMismatch(
                    f"layer {layer} {name} rows have shape {rows.shape}; the cache expects [m, {want[0]}, {want[1]}]"
                )
        m = k_rows.shape[0]
        if v_rows.shape[0] != m:
            raise KvCacheShapeMismatch(f"layer {layer}: {m} K rows but {v_rows.shape[0]} V rows")
        if self.len + m > self.capacity:
            raise KvCacheOverflow(
                f"KV cache full: {self.len} + {m} positions exceed its capacity of {self.capacity}"
            )
        self.k[layer][self.len : self.len + m] = self._encode(k_rows)
        self.v[layer][self.len : self.len + m] = self._encode(v_rows)

    def advance(self, m: int) -> None:
        if self.len + m > self.capacity:
            raise KvCacheOverflow(f"KV cache full: cannot advance {self.len} by {m} (capacity {self.capacity})")
        self.len += m

    def reset(self) -> None:
        self.len = 0

    def truncate(self, keep_len: int) -> None:
        """Rewind to the first keep_len positions; at or above len is a no-op."""
        if keep_len < self.len:
            self.len = max(0, int(keep_len))

    def copy_rows(self, src: "KvCache", start: int, end: int) -> None:
        """Copy positions [start, end) of a same-geometry cache to the same positions here."""
        if src.geometry() != self.geometry():
            raise KvCacheShapeMismatch("copy_rows between caches of different dtype or geometry")
        if self.len != start:
            raise KvCacheShapeMismatch(f"copy_rows must append in order: cache len is {self.len}, start is {start}")
        if end > src.len or end < start:
            raise KvCacheShapeMismatch(f"copy_rows range [{start}, {end}) is outside the source's {src.len} rows")
        if end > self.capacity:
            raise KvCacheOverflow(f"copy_rows to {end} exceeds capacity {self.capacity}")
        for dst_l, src_l in zip(self.k + self.v, src.k + src.v):
            dst_l[start:end] = src_l[start:end]
        self.len = end

    def keys(self, layer: int, n: int | None = None) -> np.ndarray:
        """Stored K rows [0, n) in storage form (uint16 f16 bits or q8_0 blocks)."""
        return self.k[layer][: self.len if n is None else n]

    def values(self, layer: int, n: int | None = None) -> np.ndarray:
        return self.v[layer][: self.len if n is None else n]

    def keys_f32(self, layer: int, n: int) -> np.ndarray:
        return self._decode(self.k[layer][:n], layer)

    def values_f32(self, layer: int, n: int) -> np.ndarray:
        return self._decode(self.v[layer][:n], layer)

    def _decode(self, stored: np.ndarray, layer: int) -> np.ndarray:
        if self.dtype is KvDtype.F16:
            return stored.view(np.float16).astype(np.float32)
        return q8_0.dequantize(stored)

    def byte_size(self) -> int:
        return sum(a.nbytes for a in self.k + self.v)
