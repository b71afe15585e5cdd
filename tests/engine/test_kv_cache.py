import numpy as np
import pytest

from engine.errors import KvCacheHeadDimNotBlockAligned, KvCacheOverflow, KvCacheShapeMismatch
from engine.kv.cache import KvCache
from tests.kv_rows import append_layer, keys_f32, stored_keys, stored_values, values_f32


def rows(m, h=2, d=32, value=0.5):
    return np.full((m, h, d), value, dtype=np.float32)


@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
def test_append_advance_truncate(dtype):
    c = KvCache.uniform(1, 2, 32, 8, dtype)
    append_layer(c, 0, rows(3), rows(3, value=0.25))
    assert c.len == 0  # append does not advance
    c.advance(3)
    assert c.len == 3
    np.testing.assert_allclose(keys_f32(c, 0, 3), 0.5, rtol=1e-2)
    np.testing.assert_allclose(values_f32(c, 0, 3), 0.25, rtol=1e-2)
    c.truncate(1)
    assert c.len == 1
    c.truncate(5)  # at or above len: no-op
    assert c.len == 1
    append_layer(c, 0, rows(1, value=-1.0), rows(1))
    c.advance(1)
    np.testing.assert_allclose(keys_f32(c, 0, 2)[1], -1.0, rtol=1e-2)


def test_overflow_and_shape_errors():
    c = KvCache.uniform(2, 2, 32, 4)
    with pytest.raises(KvCacheOverflow, match="capacity of 4"):
        append_layer(c, 0, rows(5), rows(5))
    with pytest.raises(KvCacheShapeMismatch, match="expects"):
        append_layer(c, 0, rows(1, h=3), rows(1, h=3))
    with pytest.raises(KvCacheShapeMismatch):
        append_layer(c, 1, rows(2), rows(1))


def test_q8_0_needs_block_aligned_head_dim():
    with pytest.raises(KvCacheHeadDimNotBlockAligned, match="multiple of 32"):
        KvCache.uniform(1, 2, 48, 4, "q8_0")
    KvCache.uniform(1, 2, 48, 4, "f16")


def test_per_layer_geometry():
    c = KvCache([8, 2], [16, 64], 4)
    append_layer(c, 0, rows(1, 8, 16), rows(1, 8, 16))
    append_layer(c, 1, rows(1, 2, 64), rows(1, 2, 64))
    c.advance(1)
    assert keys_f32(c, 1, 1).shape == (1, 2, 64)


@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
def test_copy_rows_adopts_a_prefix(dtype):
    src = KvCache.uniform(2, 2, 32, 8, dtype)
    rng = np.random.default_rng(0)
    for layer in range(2):
        append_layer(src, layer, rng.normal(size=(5, 2, 32)).astype(np.float32), rows(5))
    src.advance(5)
    dst = KvCache.uniform(2, 2, 32, 8, dtype)
    dst.copy_rows(src, 0, 3)
    assert dst.len == 3
    np.testing.assert_array_equal(stored_keys(dst, 1), stored_keys(src, 1, 3))
    with pytest.raises(KvCacheShapeMismatch, match="in order"):
        dst.copy_rows(src, 0, 2)
    with pytest.raises(KvCacheShapeMismatch, match="outside"):
        dst.copy_rows(src, 3, 6)
    with pytest.raises(KvCacheShapeMismatch, match="geometry"):
        dst.copy_rows(KvCache.uniform(2, 2, 64, 8, dtype), 3, 4)


def test_q8_0_storage_is_ggml_block_q8_0():
    from gguf import quants
    from gguf.constants import GGMLQuantizationType as T
    x = np.random.default_rng(3).normal(size=(4, 2, 64)).astype(np.float32)
    c = KvCache.uniform(1, 2, 64, 4, "q8_0")
    append_layer(c, 0, x, x)
    c.advance(4)
    assert np.array_equal(stored_keys(c, 0).reshape(-1), quants.quantize(x.reshape(-1, 64), T.Q8_0).reshape(-1))
    assert c.byte_size() == 2 * 4 * 2 * 64 // 32 * 34


@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
def test_rows_read_and_written_in_storage_form_round_trip(dtype):
    src = KvCache.uniform(2, 2, 32, 8, dtype)
    for layer in range(2):
        append_layer(src, layer, rows(3, value=layer + 0.5), rows(3, value=-layer - 0.25))
    src.advance(3)
    dst = KvCache.uniform(2, 2, 32, 8, dtype)
    for layer in range(2):
        k, v = src.read_rows(layer, 1, 3)
        assert (k.dtype, k.shape[1:]) == (src.row_layout(layer)[0], src.row_layout(layer)[1])
        dst.write_rows(layer, 0, k, v)
    dst.advance(2)
    for layer in range(2):
        np.testing.assert_array_equal(stored_keys(dst, layer), stored_keys(src, layer)[1:3])
        np.testing.assert_array_equal(stored_values(dst, layer), stored_values(src, layer)[1:3])


def test_row_reads_and_writes_outside_the_cache_are_refused():
    c = KvCache.uniform(1, 2, 32, 4)
    append_layer(c, 0, rows(2), rows(2))
    c.advance(2)
    with pytest.raises(KvCacheShapeMismatch, match=r"rows \[1, 3\) are outside the cache's 2 rows"):
        c.read_rows(0, 1, 3)
    k, v = c.read_rows(0, 0, 2)
    with pytest.raises(KvCacheOverflow, match="capacity of 4"):
        c.write_rows(0, 3, k, v)
    with pytest.raises(KvCacheShapeMismatch, match="the cache stores uint16"):
        c.write_rows(0, 0, k.astype(np.float32), v)
