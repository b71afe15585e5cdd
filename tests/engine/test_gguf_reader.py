"""The GGUF reader on good and bad files: every corruption is a clear GGUFError, fast."""

import struct

import numpy as np
import pytest

from engine.errors import GGUFError
from engine.gguf.reader import open_gguf
from tests.synthetic import write_tiny_model


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "good.gguf"
    write_tiny_model(path, "llama")
    return path


def test_reads_metadata_and_tensors(good):
    f = open_gguf(good)
    assert f.architecture == "llama"
    assert f.metadata["llama.block_count"] == 2
    info = f.tensor("blk.0.attn_q.weight")
    assert info.shape == (64, 64) and info.type_name == "Q8_0"
    assert f.raw(info).shape == (64, 64 // 32 * 34)


def _write(tmp_path, data: bytes):
    p = tmp_path / "bad.gguf"
    p.write_bytes(data)
    return p


def _header(n_tensors, n_kv):
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def _string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


@pytest.mark.parametrize("cut", [0, 3, 10, 23, 100, 1000, -1])
def test_truncated_file(good, tmp_path, cut):
    data = good.read_bytes()
    data = data[:cut] if cut >= 0 else data[:-7]
    with pytest.raises(GGUFError):
        open_gguf(_write(tmp_path, data))


def test_wrong_magic(good, tmp_path):
    with pytest.raises(GGUFError, match="not a GGUF file"):
        open_gguf(_write(tmp_path, b"GGML" + good.read_bytes()[4:]))


def test_missing_file(tmp_path):
    with pytest.raises(GGUFError, match="no such file"):
        open_gguf(tmp_path / "nope.gguf")


def test_absurd_counts(tmp_path):
    with pytest.raises(GGUFError, match="truncated or corrupt"):
        open_gguf(_write(tmp_path, _header(1 << 60, 1 << 60) + b"\0" * 64))


def test_absurd_string_length(tmp_path):
    data = _header(0, 1) + struct.pack("<Q", 1 << 62) + b"abc" + b"\0" * 64
    with pytest.raises(GGUFError, match="truncated or corrupt"):
        open_gguf(_write(tmp_path, data))


def test_absurd_array_count(tmp_path):
    data = _header(0, 1) + _string(b"k") + struct.pack("<IIQ", 9, 4, 1 << 61) + b"\0" * 64
    with pytest.raises(GGUFError, match="truncated or corrupt"):
        open_gguf(_write(tmp_path, data))


def test_absurd_string_array_count(tmp_path):
    data = _header(0, 1) + _string(b"k") + struct.pack("<IIQ", 9, 8, 1 << 40) + b"\0" * 64
    with pytest.raises(GGUFError, match="truncated or corrupt"):
        open_gguf(_write(tmp_path, data))


def test_unknown_value_type(tmp_path):
    data = _header(0, 1) + _string(b"k") + struct.pack("<I", 77) + b"\0" * 64
    with pytest.raises(GGUFError, match="unknown value type 77"):
        open_gguf(_write(tmp_path, data))


def _tensor_file(tmp_path, dims, ggml_type=0, offset=0, payload=b"\0" * 64):
    info = _string(b"w") + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
    info += struct.pack("<IQ", ggml_type, offset)
    head = _header(1, 0) + info
    head += b"\0" * (-len(head) % 32)
    return _write(tmp_path, head + payload)


def test_tensor_past_end(tmp_path):
    with pytest.raises(GGUFError, match="runs past the end"):
        open_gguf(_tensor_file(tmp_path, [16, 16]))


def test_tensor_offset_past_end(tmp_path):
    with pytest.raises(GGUFError, match="runs past the end"):
        open_gguf(_tensor_file(tmp_path, [4], offset=1 << 50))


def test_tensor_absurd_rank_and_dims(tmp_path):
    with pytest.raises(GGUFError, match="rank"):
        open_gguf(_tensor_file(tmp_path, [1] * 9))
    with pytest.raises(GGUFError, match="invalid shape"):
        open_gguf(_tensor_file(tmp_path, [1 << 62, 4]))


def test_tensor_unknown_type(tmp_path):
    with pytest.raises(GGUFError, match="unknown GGML type"):
        open_gguf(_tensor_file(tmp_path, [4], ggml_type=999))


def test_tensor_row_not_block_multiple(tmp_path):
    with pytest.raises(GGUFError, match="not a multiple"):
        open_gguf(_tensor_file(tmp_path, [33], ggml_type=8))


def test_random_corruption_never_crashes(good, tmp_path):
    """Flipping random header bytes gives a GGUFError or a file that still parses — nothing else."""
    data = bytearray(good.read_bytes())
    rng = np.random.default_rng(1)
    header_end = 2048
    for trial in range(200):
        bad = bytearray(data)
        for pos in rng.integers(4, header_end, size=3):
            bad[pos] = rng.integers(0, 256)
        p = tmp_path / f"c{trial}.gguf"
        p.write_bytes(bytes(bad))
        try:
            open_gguf(p).close()
        except GGUFError:
            pass


def _array_header(item_type: int, count: int) -> bytes:
    return struct.pack("<IQ", item_type, count)


def test_deeply_nested_arrays_are_refused_without_recursing(tmp_path):
    depth = 100_000
    value = _array_header(9, 1) * depth + _array_header(4, 0)
    data = _header(0, 1) + _string(b"k") + struct.pack("<I", 9) + value
    with pytest.raises(GGUFError, match="'k' nests arrays more than"):
        open_gguf(_write(tmp_path, data))


@pytest.mark.parametrize("count, refusal", [(5_000_000, "5000000 array items"), (100_000, "nested arrays")])
def test_many_nested_empty_arrays_are_refused_before_they_are_built(tmp_path, count, refusal):
    # the first is the 60 MB file of empty arrays that took 81 s and 968 MB to refuse
    data = _header(0, 1) + _string(b"k") + struct.pack("<I", 9) + _array_header(9, count)
    data += _array_header(4, 0) * count
    with pytest.raises(GGUFError, match=refusal):
        open_gguf(_write(tmp_path, data))


def test_array_items_are_bounded_across_the_whole_file(tmp_path):
    per_key = 1 << 20  # each array alone is allowed; together they exceed the file's budget
    item = _array_header(0, per_key) + b"\0" * per_key
    data = _header(0, 3) + b"".join(_string(k) + struct.pack("<I", 9) + item for k in (b"a", b"b", b"c"))
    with pytest.raises(GGUFError, match="'c' has 1048576 array items"):
        open_gguf(_write(tmp_path, data))


def test_absurd_but_present_metadata_key_count(tmp_path):
    n = 100_000  # the file holds them all, but no model has that many
    data = _header(0, n) + b"".join(_string(b"k%05d" % i) + struct.pack("<IB", 0, 0) for i in range(n))
    with pytest.raises(GGUFError, match="metadata items"):
        open_gguf(_write(tmp_path, data))
