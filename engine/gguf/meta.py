"""Typed readers for GGUF model metadata (spec 13.3).

Keys are read as "<arch>.<suffix>". Families disagree about zero on purpose: for
most keys a zero is as good as missing (`reject_zero`), while some (Gemma's
`attention.shared_kv_layers`) are legitimately zero (`accept_zero`).
"""

from __future__ import annotations

from enum import Enum
from typing import Mapping

import numpy as np

from engine.errors import ConfigError


class ZeroPolicy(Enum):
    REJECT_ZERO = "reject_zero"
    ACCEPT_ZERO = "accept_zero"


def _as_int(value) -> int | None:
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    return None


def meta_int_opt(meta: Mapping, arch: str, suffix: str, zero: ZeroPolicy = ZeroPolicy.REJECT_ZERO) -> int | None:
    """The integer at "<arch>.<suffix>", or None when missing, negative, non-integer or (rejected) zero."""
    v = _as_int(meta.get(f"{arch}.{suffix}"))
    if v is None or v < 0 or (v == 0 and zero is ZeroPolicy.REJECT_ZERO):
        return None
    return v


def meta_int(meta: Mapping, arch: str, suffix: str, zero: ZeroPolicy = ZeroPolicy.REJECT_ZERO) -> int:
    v = meta_int_opt(meta, arch, suffix, zero)
    if v is None:
        key = f"{arch}.{suffix}"
        found = meta.get(key)
        what = "is missing" if found is None else f"has invalid value {found!r}"
        raise ConfigError(f"model metadata {key} {what}")
    return v


def meta_float_opt(meta: Mapping, arch: str, suffix: str) -> float | None:
    v = meta.get(f"{arch}.{suffix}")
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        return None
    return float(v)


def meta_float(meta: Mapping, arch: str, suffix: str) -> float:
    v = meta_float_opt(meta, arch, suffix)
    if v is None:
        raise ConfigError(f"model metadata {arch}.{suffix} is missing or not a number")
    return v


def per_layer(meta: Mapping, key: str, n_layer: int, default=None) -> list:
    """A per-layer value: an array of n_layer items, or a scalar broadcast to every layer
    (llama.cpp's get_key_or_arr)."""
    v = meta.get(key, default)
    if v is None:
        raise ConfigError(f"model metadata {key} is missing")
    if isinstance(v, (list, np.ndarray)):
        if len(v) != n_layer:
            raise ConfigError(f"model metadata {key} has {len(v)} entries; the model has {n_layer} layers")
        return [x.item() if isinstance(x, np.generic) else x for x in v]
    return [v] * n_layer
