"""The KV sidecar (engine.kv.persist): byte-exact round trips, torn files, refused files, bytes per token."""

import numpy as np
import pytest

from engine.errors import KvPersistTokenMismatch
from engine.kv import persist
from engine.kv.cache import KvCache
from tests.synthetic import write_tiny_model

FP = bytes(range(32))
DTYPES = ["f16", "q8_0"]


def filled(n, *, dtype="f16", n_layers=3, kv_heads=2, head_dim=32, capacity=64, seed=0):
    """A cache holding n positions of random storage bytes (every bit pattern must round-trip)."""
    cache = KvCache.uniform(n_layers, kv_heads, head_dim, capacity, dtype)
    rng = np.random.default_rng(seed)
    for a in cache.k + cache.v:
        a[:n] = rng.integers(0, np.iinfo(a.dtype).max, a[:n].shape, dtype=a.dtype, endpoint=True)
    cache.len = n
    return cache


def like(cache, **changes):
    """An empty cache of the same geometry, or with `changes`."""
    shape = dict(dtype=cache.dtype, n_layers=cache.n_layers, kv_heads=cache.kv_heads[0],
                 head_dim=cache.head_dims[0], capacity=cache.capacity) | changes
    return filled(0, **shape)


def assert_rows_equal(loaded, original, n):
    assert loaded.len == n
    for a, b in zip(loaded.k + loaded.v, original.k + original.v):
        assert np.array_equal(a[:n], b[:n])


def saved(path, cache, tokens, prefix_rows=0, fp=FP):
    """Save `cache` in three appends, as a conversation's turns would."""
    persist.reset(path, cache, fp, prefix_rows)
    full = cache.len
    for end in (prefix_rows + len(tokens) // 3, prefix_rows + 2 * len(tokens) // 3, full):
        cache.len = end
        persist.append_range(path, cache, tokens[: end - prefix_rows], fp, prefix_rows)
    return path


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_is_byte_exact(tmp_path, dtype):
    cache, tokens = filled(20, dtype=dtype), list(range(100, 120))
    path = saved(tmp_path / "c.kv", cache, tokens)
    assert path.read_bytes()[:8] == b"FUXKV001"
    out = like(cache)
    loaded = persist.load(path, out, FP)
    assert loaded.tokens == tokens and loaded.prefix_rows == 0
    assert_rows_equal(out, cache, 20)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bytes_per_token_is_what_the_geometry_predicts(tmp_path, dtype):
    cache = filled(10, dtype=dtype)
    row = 32 * 2 if dtype == "f16" else 34
    assert persist.bytes_per_token(cache) == 4 + 3 * 2 * 2 * row
    path = saved(tmp_path / "c.kv", cache, list(range(10)))
    empty = tmp_path / "empty.kv"
    persist.reset(empty, cache, FP)
    assert path.stat().st_size - empty.stat().st_size == 10 * persist.bytes_per_token(cache)


def test_bytes_per_token_of_the_starter_models(capsys):
    # SmolLM2-135M: 30 layers x 3 KV heads; Qwen2.5-0.5B: 24 layers x 2 KV heads; head_dim 64 in both
    figures = {}
    for name, layers, heads in (("SmolLM2-135M", 30, 3), ("Qwen2.5-0.5B", 24, 2)):
        for dtype, row in (("f16", 128), ("q8_0", 68)):
            got = persist.bytes_per_token(KvCache.uniform(layers, heads, 64, 1, dtype))
            assert got == 4 + layers * 2 * heads * row
            figures[name, dtype] = got
    with capsys.disabled():
        print("\nsidecar bytes/token:", ", ".join(f"{n} {d} {b}" for (n, d), b in figures.items()))
    assert figures["SmolLM2-135M", "f16"] == 23044 and figures["Qwen2.5-0.5B", "q8_0"] == 6532


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_torn_file_resumes_its_longest_complete_prefix_or_nothing(tmp_path, dtype):
    cache, tokens = filled(12, dtype=dtype), list(range(500, 512))
    data = saved(tmp_path / "c.kv", cache, tokens).read_bytes()
    header, rec = len(data) - 12 * persist.bytes_per_token(cache), persist.bytes_per_token(cache)
    offsets = np.random.default_rng(1).choice(len(data), 60, replace=False).tolist() + [0, header - 1, header]
    torn = tmp_path / "torn.kv"
    for off in offsets:
        torn.write_bytes(data[:off])
        out = like(cache)
        loaded = persist.load(torn, out, FP)
        complete = max(off - header, 0) // rec
        if complete == 0:
            assert loaded is None and out.len == 0, off
        else:
            assert loaded.tokens == tokens[:complete], off
            assert_rows_equal(out, cache, complete)


def test_appending_after_a_torn_tail_rewrites_it(tmp_path):
    cache, tokens = filled(12), list(range(12))
    path = saved(tmp_path / "c.kv", cache, tokens)
    path.write_bytes(path.read_bytes()[:-persist.bytes_per_token(cache) - 7])  # record 11 torn, 10 whole
    persist.append_range(path, cache, tokens, FP)
    out = like(cache)
    assert persist.load(path, out, FP).tokens == tokens
    assert_rows_equal(out, cache, 12)


def test_every_flipped_header_byte_is_refused(tmp_path):
    cache = filled(4)
    data = saved(tmp_path / "c.kv", cache, [1, 2, 3, 4]).read_bytes()
    header = len(data) - 4 * persist.bytes_per_token(cache)
    bad = tmp_path / "bad.kv"
    for i in range(header):
        flipped = bytearray(data)
        flipped[i] ^= 0x10
        bad.write_bytes(bytes(flipped))
        assert persist.load(bad, like(cache), FP) is None, i


def test_another_models_sidecar_is_refused(tmp_path):
    cache = filled(4)
    path = saved(tmp_path / "c.kv", cache, [1, 2, 3, 4], fp=bytes(32))
    out = like(cache)
    assert persist.load(path, out, FP) is None and out.len == 0


@pytest.mark.parametrize("change", [dict(dtype="q8_0"), dict(n_layers=2), dict(n_layers=4), dict(kv_heads=1),
                                    dict(head_dim=64)])
def test_another_geometry_is_refused(tmp_path, change):
    cache = filled(4)
    path = saved(tmp_path / "c.kv", cache, [1, 2, 3, 4])
    assert persist.load(path, like(cache, **change), FP) is None


def test_a_history_beyond_capacity_is_refused_and_absent_files_are_nothing(tmp_path):
    cache = filled(10, capacity=16)
    path = saved(tmp_path / "c.kv", cache, list(range(10)))
    assert persist.load(path, like(cache, capacity=9), FP) is None
    assert persist.load(path, like(cache, capacity=10), FP) is not None
    assert persist.load(tmp_path / "absent.kv", like(cache), FP) is None
    assert persist.load(tmp_path, like(cache), FP) is None  # a directory


def test_a_preloaded_prefix_round_trips_as_v2(tmp_path):
    cache, tokens = filled(9, dtype="q8_0"), [7, 8, 9, 10, 11, 12]
    path = saved(tmp_path / "c.kv", cache, tokens, prefix_rows=3)
    data = path.read_bytes()
    assert data[:8] == b"FUXKV002"
    out = like(cache)
    loaded = persist.load(path, out, FP)
    assert loaded.tokens == tokens and loaded.prefix_rows == 3
    assert_rows_equal(out, cache, 9)
    header = len(data) - 9 * persist.bytes_per_token(cache)
    path.write_bytes(data[: header + 2 * persist.bytes_per_token(cache)])  # a tear inside the prefix
    assert persist.load(path, like(cache), FP) is None


def test_a_different_prefix_shape_starts_the_file_over(tmp_path):
    cache = filled(6)
    path = saved(tmp_path / "c.kv", cache, [1, 2, 3, 4], prefix_rows=2)
    persist.append_range(path, cache, list(range(6)), FP)
    loaded = persist.load(path, like(cache), FP)
    assert loaded.prefix_rows == 0 and loaded.tokens == list(range(6))


def test_rewind_keeps_the_common_prefix(tmp_path):
    cache, tokens = filled(10), list(range(10))
    path = saved(tmp_path / "c.kv", cache, tokens)
    persist.rewind(path, cache, FP, 6)
    other = filled(9, seed=5)  # a history that diverges after position 6
    for a, b in zip(other.k + other.v, cache.k + cache.v):
        a[:6] = b[:6]
    persist.append_range(path, other, tokens[:6] + [66, 77, 88], FP)
    out = like(cache)
    assert persist.load(path, out, FP).tokens == tokens[:6] + [66, 77, 88]
    assert_rows_equal(out, other, 9)


def test_tokens_must_describe_the_cache(tmp_path):
    cache = filled(4)
    persist.reset(tmp_path / "c.kv", cache, FP)
    with pytest.raises(KvPersistTokenMismatch):
        persist.append_range(tmp_path / "c.kv", cache, [1, 2, 3], FP)


def test_the_model_fingerprint_tells_apart_models_with_one_header(tmp_path):
    from engine.gguf.reader import open_gguf

    for seed in (0, 1):
        write_tiny_model(tmp_path / f"m{seed}.gguf", "llama", seed=seed)
    with open_gguf(tmp_path / "m0.gguf") as a, open_gguf(tmp_path / "m1.gguf") as b, \
            open_gguf(tmp_path / "m0.gguf") as a2:
        assert persist.model_fingerprint(a) == persist.model_fingerprint(a2)
        assert persist.model_fingerprint(a) != persist.model_fingerprint(b)


def test_header_size_is_the_written_header(tmp_path):
    cache = filled(0, n_layers=5)
    persist.reset(tmp_path / "a.kv", cache, FP)
    persist.reset(tmp_path / "b.kv", cache, FP, prefix_rows=3)
    assert (tmp_path / "a.kv").stat().st_size == persist.header_size(cache)
    assert (tmp_path / "b.kv").stat().st_size == persist.header_size(cache, prefix_rows=3)
