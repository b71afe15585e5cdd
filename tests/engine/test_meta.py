import numpy as np
import pytest

from engine.errors import ConfigError
from engine.gguf.meta import ZeroPolicy, meta_float, meta_int, meta_int_opt, per_layer

META = {"arch.block_count": 24, "arch.shared_kv_layers": 0, "arch.neg": -3, "arch.eps": 1e-6,
        "arch.flag": True, "arch.heads_kv": np.array([2, 2, 4], dtype=np.int32)}


def test_zero_valued_keys_split_by_policy():
    assert meta_int(META, "arch", "block_count") == 24
    with pytest.raises(ConfigError, match="arch.shared_kv_layers"):
        meta_int(META, "arch", "shared_kv_layers", ZeroPolicy.REJECT_ZERO)
    assert meta_int(META, "arch", "shared_kv_layers", ZeroPolicy.ACCEPT_ZERO) == 0
    assert meta_int_opt(META, "arch", "missing", ZeroPolicy.ACCEPT_ZERO) is None


def test_negative_and_non_integer_values_are_invalid():
    assert meta_int_opt(META, "arch", "neg") is None
    assert meta_int_opt(META, "arch", "flag") is None
    assert meta_int_opt(META, "arch", "eps") is None
    with pytest.raises(ConfigError, match="missing"):
        meta_int(META, "arch", "missing")
    assert meta_float(META, "arch", "eps") == pytest.approx(1e-6)
    with pytest.raises(ConfigError):
        meta_float(META, "arch", "missing")


def test_per_layer_broadcast_and_arrays():
    assert per_layer(META, "arch.block_count", 3) == [24, 24, 24]
    assert per_layer(META, "arch.heads_kv", 3) == [2, 2, 4]
    with pytest.raises(ConfigError, match="3 entries"):
        per_layer(META, "arch.heads_kv", 4)
    assert per_layer(META, "arch.nothing", 2, default=5) == [5, 5]
