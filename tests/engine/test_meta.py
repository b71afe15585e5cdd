import numpy as np
import pytest

from engine.errors import ConfigError, TokenizerError
from engine.gguf.meta import ZeroPolicy, meta_float, meta_int, meta_int_opt, meta_value, per_layer, per_layer_int

META = {"arch.block_count": 24, "arch.shared_kv_layers": 0, "arch.neg": -3, "arch.eps": 1e-6,
        "arch.flag": True, "arch.heads_kv": np.array([2, 2, 4], dtype=np.int32)}


def test_zero_valued_keys_split_by_policy():
    assert meta_int(META, "arch", "block_count") == 24
    with pytest.raises(ConfigError, match="arch.shared_kv_layers"):
        meta_int(META, "arch", "shared_kv_layers", ZeroPolicy.REJECT_ZERO)
    assert meta_int(META, "arch", "shared_kv_layers", ZeroPolicy.ACCEPT_ZERO) == 0
    assert meta_int_opt(META, "arch", "missing", ZeroPolicy.ACCEPT_ZERO) is None


def test_present_but_invalid_values_are_errors_naming_the_key():
    # a corrupt value is not "missing": no silent fallback to a default
    for suffix in ("neg", "flag", "eps"):
        with pytest.raises(ConfigError, match=f"arch.{suffix} is .*; expected"):
            meta_int_opt(META, "arch", suffix)
    with pytest.raises(ConfigError, match="missing"):
        meta_int(META, "arch", "missing")
    assert meta_float(META, "arch", "eps") == pytest.approx(1e-6)
    with pytest.raises(ConfigError):
        meta_float(META, "arch", "missing")
    for bad in (float("nan"), float("inf"), "1e-6", True):
        with pytest.raises(ConfigError, match="arch.eps is .*; expected"):
            meta_float({"arch.eps": bad}, "arch", "eps")


def test_meta_value_checks_the_kind():
    meta = {"k.s": "x", "k.ids": [1, 2], "k.strs": ["a", 3], "k.n": 7, "k.b": np.bool_(True),
            "k.nested": [np.array([1])], "k.f": np.array([0.5], np.float32)}
    assert meta_value(meta, "k.s", "string") == "x"
    assert meta_value(meta, "k.n", "integer") == 7 and meta_value(meta, "k.b", "bool") is True
    assert meta_value(meta, "k.ids", "integers").tolist() == [1, 2]
    assert meta_value(meta, "k.f", "numbers").dtype == np.float32
    assert meta_value(meta, "k.missing", "strings") is None
    for key, kind in (("k.strs", "strings"), ("k.s", "integer"), ("k.n", "bool"), ("k.nested", "integers"),
                      ("k.f", "integers"), ("k.b", "integer")):
        with pytest.raises(ConfigError, match=f"{key} is .*; expected"):
            meta_value(meta, key, kind)
    with pytest.raises(TokenizerError, match="k.s"):
        meta_value(meta, "k.s", "strings", TokenizerError)


def test_per_layer_broadcast_and_arrays():
    assert per_layer(META, "arch.block_count", 3) == [24, 24, 24]
    assert per_layer(META, "arch.heads_kv", 3) == [2, 2, 4]
    with pytest.raises(ConfigError, match="3 entries"):
        per_layer(META, "arch.heads_kv", 4)
    assert per_layer(META, "arch.nothing", 2, default=5) == [5, 5]


def test_per_layer_int_refuses_non_counts():
    assert per_layer_int(META, "arch.heads_kv", 3) == [2, 2, 4]
    for bad in ([1.5, 2.0], ["a", "b"], [-1, 2], [np.array([1]), np.array([2])]):
        with pytest.raises(ConfigError, match="arch.h is .*; expected"):
            per_layer_int({"arch.h": bad}, "arch.h", 2)
