"""The two-thread CRC-32: zlib's value for every length and split, whichever side of the two-thread size."""

import zlib

import numpy as np
import pytest

from engine.kv import crc


@pytest.mark.parametrize("n", [0, 1, 7, crc._TWO_THREADS_FROM - 1, crc._TWO_THREADS_FROM, crc._TWO_THREADS_FROM + 3,
                               3 * crc._TWO_THREADS_FROM + 1])
def test_crc32_is_zlibs_whatever_the_length(n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    assert crc.crc32(data) == zlib.crc32(data)
    assert crc.crc32(memoryview(data)) == zlib.crc32(data)


def test_combine_joins_the_crcs_of_any_split():
    data = np.random.default_rng(1).integers(0, 256, 10_007, dtype=np.uint8).tobytes()
    for cut in (0, 1, 31, 5_000, 10_006, 10_007):
        a, b = data[:cut], data[cut:]
        assert crc.combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(data), cut


def test_a_changed_byte_in_either_half_changes_the_crc():
    data = bytearray(np.random.default_rng(2).integers(0, 256, 2 * crc._TWO_THREADS_FROM, dtype=np.uint8).tobytes())
    good = crc.crc32(data)
    for at in (0, len(data) // 2 - 1, len(data) // 2, len(data) - 1):
        data[at] ^= 1
        assert crc.crc32(data) != good, at
        data[at] ^= 1
    assert crc.crc32(data) == good


@pytest.mark.parametrize("nbytes", [10, crc._TWO_THREADS_FROM])
def test_map_halves_keeps_the_order_on_either_path(nbytes):
    assert crc.map_halves(lambda i: i * i, range(11), nbytes) == [i * i for i in range(11)]
    assert crc.map_halves(lambda i: i, range(0), nbytes) == []
