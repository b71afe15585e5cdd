"""The engine through the backend seam: a backend without a fused row stack gets the row-wise property
from the composed ops, and a cache on another backend than the model's is refused."""

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from engine.errors import KvCacheShapeMismatch, KvDtypeUnsupported
from engine.kv.cache import KvCache
from engine.models import load_model
from kernels.backend import UnsupportedKvDtype
from kernels.cpu.backend import CpuBackend
from tests.kv_rows import stored_keys
from tests.synthetic import write_tiny_model


class ComposingBackend(CpuBackend):
    """The CPU's ops without its fused row stack: the engine composes the row-wise ops, as on a device."""

    name = "composing"

    def row_stack(self, layers, first_layer=0):
        return None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("seam") / "gemma3.gguf"
    write_tiny_model(path, "gemma3", qtype=T.Q8_0, window=3)
    return path


def test_composed_row_wise_ops_give_each_row_its_one_row_bits(tiny):
    model = load_model(tiny, ComposingBackend())
    prompt, rows = [3, 17, 59], [5, 8, 13, 21, 34]
    one = model.new_cache(16)
    model.forward(prompt, one)
    alone = np.stack([model.forward([t], one) for t in rows])
    together_cache = model.new_cache(16)
    model.forward(prompt, together_cache)
    together = model.forward_rows(rows, together_cache)
    np.testing.assert_array_equal(together, alone)
    for layer in range(model.n_layers):
        np.testing.assert_array_equal(stored_keys(together_cache, layer), stored_keys(one, layer))


def test_a_cache_on_another_backend_is_refused(tiny):
    model = load_model(tiny)
    other = KvCache(*model.args.kv_geometry(), 16, backend=ComposingBackend())
    with pytest.raises(KvCacheShapeMismatch, match="lives on the composing backend; this model runs on the cpu"):
        model.forward([1, 2], other)


class F16OnlyBackend(CpuBackend):
    name = "f16-only"

    def kv_store(self, kv_heads, head_dims, capacity, dtype, value_is_key=None):
        if dtype != "f16":
            raise UnsupportedKvDtype(f"the f16-only backend keeps an f16 KV cache, not {dtype}")
        return super().kv_store(kv_heads, head_dims, capacity, dtype, value_is_key)


def test_a_cache_type_the_backend_does_not_keep_is_a_user_error():
    with pytest.raises(KvDtypeUnsupported, match=r"not q8_0: use the f16 KV cache \(--kv f16\) or the cpu backend"):
        KvCache([2], [32], 8, "q8_0", F16OnlyBackend())
