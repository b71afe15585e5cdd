"""A KvCache's rows as tests write and read them: f32 rows in, and the stored rows out (in storage form, or
widened to f32). The engine itself never needs these: its models write the cache through their backend, and
the sidecar and cartridges move rows in storage form (read_rows, write_rows)."""

from __future__ import annotations

import numpy as np

from engine.errors import KvCacheOverflow, KvCacheShapeMismatch
from engine.kv.cache import KvCache
from kernels.backend import kv_rows_f32


def append_layer(cache: KvCache, layer: int, k_rows: np.ndarray, v_rows: np.ndarray) -> None:
    """Write f32 rows [m, kv_heads, head_dim] at offset len. Does not advance: call cache.advance(m) once
    after every layer has been written."""
    want = (cache.kv_heads[layer], cache.head_dims[layer])
    for name, rows in (("K", k_rows), ("V", v_rows)):
        if rows.ndim != 3 or rows.shape[1:] != want:
            raise KvCacheShapeMismatch(
                f"layer {layer} {name} rows have shape {rows.shape}; the cache expects [m, {want[0]}, {want[1]}]"
            )
    m = k_rows.shape[0]
    if v_rows.shape[0] != m:
        raise KvCacheShapeMismatch(f"layer {layer}: {m} K rows but {v_rows.shape[0]} V rows")
    if cache.len + m > cache.capacity:
        raise KvCacheOverflow(
            f"KV cache full: {cache.len} + {m} positions exceed its capacity of {cache.capacity}"
        )
    cache.store.write_f32(layer, cache.len, k_rows, v_rows)


def stored_keys(cache: KvCache, layer: int, n: int | None = None) -> np.ndarray:
    """Stored K rows [0, n) in storage form (uint16 f16 bits or q8_0 blocks)."""
    return cache.store.read(layer, 0, cache.len if n is None else n)[0]


def stored_values(cache: KvCache, layer: int, n: int | None = None) -> np.ndarray:
    return cache.store.read(layer, 0, cache.len if n is None else n)[1]


def keys_f32(cache: KvCache, layer: int, n: int) -> np.ndarray:
    return kv_rows_f32(cache.dtype.value, stored_keys(cache, layer, n))


def values_f32(cache: KvCache, layer: int, n: int) -> np.ndarray:
    return kv_rows_f32(cache.dtype.value, stored_values(cache, layer, n))
