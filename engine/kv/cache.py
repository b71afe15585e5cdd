"""Per-layer post-RoPE key/value store for autoregressive decoding (spec 13.4).

The rows live in the model's backend (a kernels.backend KvStore: host arrays on
the CPU, device memory elsewhere); this class keeps the length and the checks.
Each layer holds `capacity` positions of K and of V. f16 (default) rows are
stored as uint16 bit patterns, which the attention kernels widen in-register;
q8_0 rows as GGML block_q8_0 bytes. The cache has no window logic: windowed
models mask at read time, which keeps `truncate` (the rewind primitive) a
single integer store.
"""

from __future__ import annotations

from enum import Enum
from typing import Sequence

import numpy as np

from engine.errors import KvCacheHeadDimNotBlockAligned, KvCacheOverflow, KvCacheShapeMismatch, KvDtypeUnsupported
from kernels.backend import Q8_0_BLOCK, Backend, UnsupportedKvDtype, cpu_backend


class KvDtype(str, Enum):
    F16 = "f16"
    Q8_0 = "q8_0"


class KvCache:
    """Attention's memory (engine.kv.memory): a row per position, so every Memory operation is free."""

    persistable = True  # rows are saved to and loaded from sidecars (engine.kv.persist)
    composable = True  # cartridges' rows are placed in it (engine.cartridge)
    state_store = None  # no recurrent state (a hybrid model's memory has one: engine.kv.recurrent)
    state_shapes: tuple = ()

    def __init__(self, kv_heads: Sequence[int], head_dims: Sequence[int], capacity: int,
                 dtype: KvDtype | str = KvDtype.F16, backend: Backend | None = None,
                 value_is_key: Sequence[bool] | None = None):
        if len(kv_heads) != len(head_dims):
            raise KvCacheShapeMismatch(f"{len(kv_heads)} kv_heads entries but {len(head_dims)} head_dims entries")
        # per layer: its V rows are its K rows (latent attention's one row per position), held once
        shared = (False,) * len(kv_heads) if value_is_key is None else tuple(bool(s) for s in value_is_key)
        if len(shared) != len(kv_heads):
            raise KvCacheShapeMismatch(f"{len(kv_heads)} kv_heads entries but {len(shared)} value_is_key entries")
        self.value_is_key = shared
        if capacity <= 0:
            raise KvCacheShapeMismatch(f"capacity must be positive, got {capacity}")
        self.dtype = KvDtype(dtype)
        self.kv_heads = tuple(int(h) for h in kv_heads)
        self.head_dims = tuple(int(d) for d in head_dims)
        self.capacity = int(capacity)
        self.len = 0
        # called (pos0, tokens, hidden [m, n_embd]) with the model's final normed hidden states of the rows it
        # feeds here: a next-token-prediction draft source follows the conversation through it
        self.hidden_sink = None
        if self.dtype is KvDtype.Q8_0:
            bad = [d for d in self.head_dims if d % Q8_0_BLOCK]
            if bad:
                raise KvCacheHeadDimNotBlockAligned(
                    f"a q8_0 KV cache needs head_dim to be a multiple of {Q8_0_BLOCK}; this model has {bad[0]}"
                )
        self.backend = backend or cpu_backend()
        try:
            self.store = self.backend.kv_store(self.kv_heads, self.head_dims, self.capacity, self.dtype.value,
                                               self.value_is_key)
        except UnsupportedKvDtype as e:
            raise KvDtypeUnsupported(f"{e}: use the f16 KV cache (--kv f16) or the cpu backend") from None

    @classmethod
    def uniform(cls, n_layers: int, kv_heads: int, head_dim: int, capacity: int,
                dtype: KvDtype | str = KvDtype.F16) -> "KvCache":
        return cls([kv_heads] * n_layers, [head_dim] * n_layers, capacity, dtype)

    @property
    def n_layers(self) -> int:
        return len(self.kv_heads)

    @property
    def k(self) -> list[np.ndarray]:
        """Every layer's K rows [capacity, kv_heads, width] in storage form (a cache in host memory only)."""
        return self.store.k

    @property
    def v(self) -> list[np.ndarray]:
        return self.store.v

    def geometry(self) -> tuple:
        """(dtype, kv heads per layer, head size per layer); which layers share V with K follows the model."""
        return (self.dtype.value, self.kv_heads, self.head_dims)

    def row_layout(self, layer: int) -> tuple[np.dtype, tuple[int, int]]:
        """One position of a layer in storage form: (dtype, (kv_heads, width))."""
        return self.store.row_layout(layer)

    def read_rows(self, layer: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions [start, end) of a layer (within len) as storage-form host arrays (K, V)."""
        if not 0 <= start <= end <= self.len:
            raise KvCacheShapeMismatch(f"rows [{start}, {end}) are outside the cache's {self.len} rows")
        return self.store.read(layer, start, end)

    def write_rows(self, layer: int, start: int, k_rows: np.ndarray, v_rows: np.ndarray) -> None:
        """Store storage-form rows (what read_rows returns) at positions start..; does not advance."""
        dtype, shape = self.row_layout(layer)
        for name, rows in (("K", k_rows), ("V", v_rows)):
            if rows.dtype != dtype or rows.shape[1:] != shape or len(rows) != len(k_rows):
                raise KvCacheShapeMismatch(f"layer {layer} {name} rows are {rows.dtype} {rows.shape}; the cache "
                                           f"stores {dtype} [m, {shape[0]}, {shape[1]}]")
        if start + len(k_rows) > self.capacity:
            raise KvCacheOverflow(f"rows up to {start + len(k_rows)} exceed the cache's capacity of {self.capacity}")
        self.store.write(layer, start, k_rows, v_rows)

    def advance(self, m: int) -> None:
        if self.len + m > self.capacity:
            raise KvCacheOverflow(f"KV cache full: cannot advance {self.len} by {m} (capacity {self.capacity})")
        self.len += m

    def reset(self) -> None:
        self.len = 0

    def can_truncate(self, keep_len: int) -> bool:
        return True  # rows past keep_len are simply written over

    def truncation_point(self, n: int) -> int:
        return max(0, min(n, self.len))

    def mark(self) -> None:
        pass  # every position is a place it can be cut to

    def feeding(self, m: int, row_wise: bool) -> None:
        pass  # rows need no preparing

    def truncate(self, keep_len: int) -> None:
        """Rewind to the first keep_len positions; at or above len is a no-op."""
        if keep_len < self.len:
            self.len = max(0, int(keep_len))

    def checkpoint(self) -> int:
        return self.len

    def restore(self, checkpoint: int) -> None:
        self.truncate(checkpoint)

    def copy_prefix(self, src: "KvCache", n: int) -> None:
        self.reset()
        self.copy_rows(src, 0, n)

    def copy_rows(self, src: "KvCache", start: int, end: int) -> None:
        """Copy positions [start, end) of a same-geometry cache to the same positions here."""
        same = src.geometry() == self.geometry() and src.value_is_key == self.value_is_key
        if not same or src.backend is not self.backend:
            raise KvCacheShapeMismatch("copy_rows between caches of different dtype, geometry or backend")
        if self.len != start:
            raise KvCacheShapeMismatch(f"copy_rows must append in order: cache len is {self.len}, start is {start}")
        if end > src.len or end < start:
            raise KvCacheShapeMismatch(f"copy_rows range [{start}, {end}) is outside the source's {src.len} rows")
        if end > self.capacity:
            raise KvCacheOverflow(f"copy_rows to {end} exceeds capacity {self.capacity}")
        self.store.copy_from(src.store, start, end)
        self.len = end

    def byte_size(self) -> int:
        return self.store.nbytes()
