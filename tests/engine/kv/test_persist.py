"""The KV sidecar (engine.kv.persist): byte-exact round trips, torn and damaged files, refused files, bytes per
token, and writers in two processes."""

import struct
import zlib
from functools import partial

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
    assert path.read_bytes()[:8] == b"FUXKV005"
    out = like(cache)
    loaded = persist.load(path, out, FP)
    assert loaded.tokens == tokens and loaded.prefix_rows == 0
    assert_rows_equal(out, cache, 20)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bytes_per_token_is_what_the_geometry_predicts(tmp_path, dtype):
    cache = filled(10, dtype=dtype)
    row = 32 * 2 if dtype == "f16" else 34
    assert persist.bytes_per_token(cache) == 4 + 3 * 2 * 2 * row + 4  # token, K/V rows, CRC
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
            assert got == 8 + layers * 2 * heads * row
            figures[name, dtype] = got
    with capsys.disabled():
        print("\nsidecar bytes/token:", ", ".join(f"{n} {d} {b}" for (n, d), b in figures.items()))
    assert figures["SmolLM2-135M", "f16"] == 23048 and figures["Qwen2.5-0.5B", "q8_0"] == 6536


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


def test_a_preloaded_prefix_round_trips(tmp_path):
    cache, tokens = filled(9, dtype="q8_0"), [7, 8, 9, 10, 11, 12]
    path = saved(tmp_path / "c.kv", cache, tokens, prefix_rows=3)
    data = path.read_bytes()
    assert data[:8] == b"FUXKV005"
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
    assert (tmp_path / "b.kv").stat().st_size == persist.header_size(cache)


def expected_resume(offset, header, rec, prefix_rows=0):
    """What a file damaged at byte `offset` may resume: None for the header or a damaged first (or prefix)
    record, else the records before the damaged one."""
    if offset < header:
        return None
    damaged = (offset - header) // rec
    return None if damaged < max(prefix_rows, 1) else damaged


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("prefix_rows", [0, 3])
def test_a_damaged_byte_anywhere_resumes_only_the_records_before_it(tmp_path, dtype, prefix_rows):
    cache, tokens = filled(14, dtype=dtype, n_layers=2), list(range(900, 914 - prefix_rows))
    data = saved(tmp_path / "c.kv", cache, tokens, prefix_rows).read_bytes()
    rec = persist.bytes_per_token(cache)
    header = len(data) - 14 * rec
    rng = np.random.default_rng(7)
    offsets = sorted(set(rng.choice(len(data), 200, replace=False).tolist()) | set(range(header))
                     | {header, header + rec - 1, len(data) - 1})
    assert len(offsets) >= 250
    bad = tmp_path / "bad.kv"
    for off in offsets:
        damaged = bytearray(data)
        damaged[off] ^= int(rng.integers(1, 256))
        bad.write_bytes(bytes(damaged))
        out = like(cache)
        loaded, want = persist.load(bad, out, FP), expected_resume(off, header, rec, prefix_rows)
        if want is None:
            assert loaded is None and out.len == 0, off
        else:
            assert loaded.prefix_rows == prefix_rows and loaded.tokens == tokens[: want - prefix_rows], off
            assert_rows_equal(out, cache, want)


def test_rows_overwritten_with_a_plausible_value_are_not_resumed(tmp_path):
    cache, tokens = filled(10), list(range(10))
    path = saved(tmp_path / "c.kv", cache, tokens)
    data = np.frombuffer(path.read_bytes(), np.uint8).copy()
    rec = persist.bytes_per_token(cache)
    header = len(data) - 10 * rec
    row = data[header + 6 * rec + 4: header + 6 * rec + 4 + 64].view(np.uint16)
    row[:] = 0x7BFF  # f16 65504: a finite value, so nothing but the CRC tells it apart
    path.write_bytes(data.tobytes())
    out = like(cache)
    assert persist.load(path, out, FP).tokens == tokens[:6]
    assert_rows_equal(out, cache, 6)


def test_a_record_moved_to_another_position_is_not_resumed(tmp_path):
    cache, tokens = filled(6), [5, 5, 5, 5, 5, 5]
    data = bytearray(saved(tmp_path / "c.kv", cache, tokens).read_bytes())
    rec = persist.bytes_per_token(cache)
    header = len(data) - 6 * rec
    data[header + 4 * rec: header + 5 * rec] = data[header + 1 * rec: header + 2 * rec]
    (tmp_path / "c.kv").write_bytes(bytes(data))
    assert persist.load(tmp_path / "c.kv", like(cache), FP).tokens == tokens[:4]


def old_format_file(path, cache, tokens, prefix_rows):
    """A sidecar as formats 1 and 2 wrote it: no record CRCs; format 2 (FUXKV002) for a preloaded prefix."""
    body = struct.pack("<32sII", FP, 0, cache.n_layers)
    body += b"".join(struct.pack("<II", k.shape[1], k.shape[2] * 2) for k in cache.k)
    magic = b"FUXKV002" if prefix_rows else b"FUXKV001"
    body += struct.pack("<Q", prefix_rows) if prefix_rows else b""
    ids = [persist.PREFIX_TOKEN] * prefix_rows + tokens
    unsealed = magic + struct.pack("<QI", len(ids), 0) + body
    header = magic + struct.pack("<QI", len(ids), zlib.crc32(unsealed)) + body
    records = b"".join(struct.pack("<I", t) + b"".join(a[i].tobytes() for layer in zip(cache.k, cache.v)
                                                        for a in layer) for i, t in enumerate(ids))
    path.write_bytes(header + records)


def format_3_or_4_file(magic, path, cache, tokens, prefix_rows):
    """A sidecar as formats 3 and 4 wrote it: today's bytes without the state-layer count (3 had no latent flag
    either, which these caches do not set), under its magic, its header CRC sealed."""
    saved(path, cache, tokens, prefix_rows)
    data = path.read_bytes()
    end = 60 + 8 * cache.n_layers  # the state-layer count, then the prefix rows
    body = data[20:end] + data[end + 4: end + 12]
    unsealed = magic + data[8:16] + struct.pack("<I", 0) + body
    path.write_bytes(magic + data[8:16] + struct.pack("<I", zlib.crc32(unsealed)) + body + data[end + 12:])


@pytest.mark.parametrize("write", [old_format_file, partial(format_3_or_4_file, b"FUXKV003"),
                                   partial(format_3_or_4_file, b"FUXKV004")],
                         ids=["formats 1 and 2", "format 3", "format 4"])
@pytest.mark.parametrize("prefix_rows", [0, 2])
def test_files_of_older_formats_are_refused_and_rewritten(tmp_path, prefix_rows, write):
    cache, tokens = filled(5), [1, 2, 3, 4, 5][prefix_rows:]
    path = tmp_path / "c.kv"
    write(path, cache, tokens, prefix_rows)
    out = like(cache)
    assert persist.load(path, out, FP) is None and out.len == 0
    persist.append_range(path, cache, tokens, FP, prefix_rows)  # the next save starts the file over
    assert persist.load(path, like(cache), FP).tokens == tokens


def test_an_update_extending_another_history_is_refused(tmp_path):
    cache, tokens = filled(8), list(range(8))
    path = tmp_path / "c.kv"
    cache.len = 4
    persist.append_range(path, cache, tokens[:4], FP)
    other = filled(8, seed=3)  # another process's history, saved over this file
    other.len = 4
    persist.append_range(path, other, [9, 9, 9, 9], FP)
    cache.len = 8
    before = path.read_bytes()
    assert not persist.apply(path, persist.snapshot(cache, tokens, FP, 0, 4))  # its positions 0..3 are gone
    assert path.read_bytes() == before
    assert persist.apply(path, persist.snapshot(cache, tokens, FP, 0, 0))  # written whole, it is this one's
    assert persist.load(path, like(cache), FP).tokens == tokens


def test_a_file_held_by_another_writer_is_waited_for_then_refused_with_a_clear_error(tmp_path, monkeypatch):
    from engine.errors import KvSidecarLocked
    from engine.kv import file_lock
    from engine.kv.sidecar_writer import SidecarWriter

    cache, tokens = filled(4), [1, 2, 3, 4]
    path = saved(tmp_path / "c.kv", cache, tokens)
    monkeypatch.setattr(file_lock, "TIMEOUT_S", 0.2)
    writer = SidecarWriter()
    with file_lock.locked(path):  # another process in the middle of a write (flock: another open file)
        with pytest.raises(KvSidecarLocked, match="c.kv"):
            persist.load(path, like(cache), FP)
        writer.submit(path, persist.snapshot(cache, tokens, FP, 0, 0))
        writer.flush()
    assert "locked" in writer.take_failure(path)
    assert persist.load(path, like(cache), FP).tokens == tokens  # free again


_RIVAL_WRITER = """
import sys
import numpy as np
from engine.kv import persist
from engine.kv.cache import KvCache
seed, path = int(sys.argv[1]), sys.argv[2]
cache = KvCache.uniform(3, 2, 32, 64)
rng = np.random.default_rng(seed)
for a in cache.k + cache.v:
    a[:] = rng.integers(0, 65535, a.shape, dtype=a.dtype)
tokens = [seed] * 64
for turn in range(1500):  # a conversation that grows by a few positions per turn, and starts over
    end = 4 + turn % 20 * 3
    cache.len = end
    start = 0 if turn % 20 == 0 else end - 3
    if not persist.apply(path, persist.snapshot(cache, tokens[:end], bytes(range(32)), 0, start)):
        persist.apply(path, persist.snapshot(cache, tokens[:end], bytes(range(32)), 0, 0))
"""


def test_two_processes_writing_one_file_never_interleave(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "c.kv"
    caches = {}
    for seed in (1, 2):
        caches[seed] = cache = KvCache.uniform(3, 2, 32, 64)
        rng = np.random.default_rng(seed)
        for a in cache.k + cache.v:
            a[:] = rng.integers(0, 65535, a.shape, dtype=a.dtype)
    rivals = [subprocess.Popen([sys.executable, "-c", _RIVAL_WRITER, str(seed), str(path)],
                               cwd=Path(__file__).parents[3]) for seed in (1, 2)]
    loads = 0
    while any(p.poll() is None for p in rivals) or not loads:
        out = KvCache.uniform(3, 2, 32, 64)
        loaded = persist.load(path, out, FP)
        if loaded is not None:  # one writer's history, whole: its tokens and its rows
            loads += 1
            seed = loaded.tokens[0]
            assert set(loaded.tokens) == {seed}, loaded.tokens
            assert_rows_equal(out, caches[seed], out.len)
    assert [p.wait() for p in rivals] == [0, 0] and loads
