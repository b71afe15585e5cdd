"""Typed readers for GGUF model metadata (spec 13.3).

Keys are read as "<arch>.<suffix>". Families disagree about zero on purpose: for
most keys a zero is as good as missing (`reject_zero`), while some (Gemma's
`attention.shared_kv_layers`) are legitimately zero (`accept_zero`). A value that is
present but of the wrong kind (a string, a NaN, a negative count) is an error naming
its key, never silently replaced by a default: the file is corrupt or hostile.
"""

from __future__ import annotations

import math
import reprlib
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


def _invalid(key: str, value, expected: str, error: type[Exception] = ConfigError) -> Exception:
    shown = f"an array of {value.size} {value.dtype}" if isinstance(value, np.ndarray) else reprlib.repr(value)
    return error(f"model metadata {key} is {shown}; expected {expected}")


def meta_int_opt(meta: Mapping, arch: str, suffix: str, zero: ZeroPolicy = ZeroPolicy.REJECT_ZERO) -> int | None:
    """The integer at "<arch>.<suffix>", or None when missing or a (rejected) zero."""
    key = f"{arch}.{suffix}"
    found = meta.get(key)
    if found is None:
        return None
    v = _as_int(found)
    if v is None or v < 0:
        raise _invalid(key, found, "a non-negative integer")
    return None if v == 0 and zero is ZeroPolicy.REJECT_ZERO else v


def meta_int(meta: Mapping, arch: str, suffix: str, zero: ZeroPolicy = ZeroPolicy.REJECT_ZERO) -> int:
    v = meta_int_opt(meta, arch, suffix, zero)
    if v is None:
        key = f"{arch}.{suffix}"
        what = "is missing" if meta.get(key) is None else "is 0"
        raise ConfigError(f"model metadata {key} {what}")
    return v


def meta_float_opt(meta: Mapping, arch: str, suffix: str, default: float | None = None) -> float | None:
    """The finite number at "<arch>.<suffix>", or `default` when missing."""
    key = f"{arch}.{suffix}"
    v = meta.get(key)
    if v is None:
        return default
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)) \
            or not math.isfinite(v):
        raise _invalid(key, v, "a finite number")
    return float(v)


def meta_float(meta: Mapping, arch: str, suffix: str) -> float:
    v = meta_float_opt(meta, arch, suffix)
    if v is None:
        raise ConfigError(f"model metadata {arch}.{suffix} is missing")
    return v


def _number_array(v, dtype_kinds: str) -> np.ndarray | None:
    if isinstance(v, list) and all(isinstance(x, (int, float, np.number)) and not isinstance(x, bool) for x in v):
        v = np.asarray(v)  # metadata written by hand rather than read from a file
    return v if isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in dtype_kinds else None


# meta_value kinds: the value as the engine uses it (None: of another kind), and what was expected
_KINDS = {
    "integer": (_as_int, "an integer"),
    "bool": (lambda v: bool(v) if isinstance(v, (bool, np.bool_)) else None, "true or false"),
    "string": (lambda v: v if isinstance(v, str) else None, "a string"),
    "strings": (lambda v: v if isinstance(v, list) and all(isinstance(x, str) for x in v) else None,
                "an array of strings"),
    "integers": (lambda v: _number_array(v, "iu"), "an array of integers"),
    "numbers": (lambda v: _number_array(v, "iuf"), "an array of numbers"),
}


def meta_value(meta: Mapping, key: str, kind: str, error: type[Exception] = ConfigError):
    """The value at the full `key` (None when missing), checked to be of `kind` (see _KINDS); a value
    of another kind is an `error` naming the key."""
    found = meta.get(key)
    if found is None:
        return None
    convert, expected = _KINDS[kind]
    v = convert(found)
    if v is None:
        raise _invalid(key, found, expected, error)
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


def per_layer_int(meta: Mapping, key: str, n_layer: int, default: int | None = None) -> list[int]:
    """per_layer for a count: a non-negative integer, or one per layer."""
    values = [_as_int(v) for v in per_layer(meta, key, n_layer, default)]
    if any(v is None or v < 0 for v in values):
        raise _invalid(key, meta.get(key), "a non-negative integer or one per layer")
    return values
