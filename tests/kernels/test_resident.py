"""kernels/cpu/resident.py: a weight read at every token is copied once into huge-page-backed memory, the
process then holds its bytes once (the file's pages it read are unmapped again), a weight that is not a
view of a read-only file mapping is copied without being touched, and where huge pages come slowly the
weights stay where they are."""

import mmap
import sys
from pathlib import Path

import numpy as np
import pytest
from numpy.testing import assert_array_equal

from kernels.cpu import resident as r
from kernels.cpu.backend import CpuBackend

SIZE = 64 << 20
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_HUGEPAGE and /proc are Linux's")


@pytest.fixture(autouse=True)
def huge_pages_fast(monkeypatch):
    """Each test judges huge pages afresh; this machine's speed at giving them must not decide what the copy
    tests see (a VM may give them slowly, and the weights then stay views), so they count as fast."""
    faults = r.HugePageFaults()
    faults.SLOW_BELOW = 0
    monkeypatch.setattr(r, "_faults", faults)
    numpy_advised = r.numpy_huge_pages(True)
    yield faults
    r.numpy_huge_pages(numpy_advised)  # a judgement of slow turns it off for the process


def _status_kb(field: str) -> int:
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field))


def _file_view(tmp_path: Path, rows: int, row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(the bytes written, a read-only view of a mapping of the file holding them), as the GGUF reader maps."""
    data = np.random.default_rng(0).integers(0, 256, (rows, row_bytes), dtype=np.uint8)
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 96 + data.tobytes())  # an offset that is not a page's, as a tensor's in a GGUF
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return data, np.frombuffer(mapping, np.uint8, count=data.size, offset=96).reshape(data.shape)


@linux
def test_a_mapped_weight_is_copied_and_its_file_pages_unmapped(tmp_path):
    data, view = _file_view(tmp_path, 1024, SIZE // 1024)
    before = _status_kb("RssFile:")
    assert int(view.sum(dtype=np.uint64)) == int(data.sum(dtype=np.uint64))  # every file page mapped in
    assert _status_kb("RssFile:") - before > 0.9 * SIZE / 1024

    copy = r.resident(view)

    assert_array_equal(copy, data)
    assert not np.shares_memory(copy, view) and not copy.flags.writeable
    assert _status_kb("RssFile:") - before < 0.05 * SIZE / 1024, "the file's pages stayed mapped beside the copy"


@linux
def test_the_copy_lies_in_huge_pages_where_the_system_gives_them():
    policy = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not policy.exists() or "[never]" in policy.read_text():
        pytest.skip("transparent huge pages are off on this system")
    copy = r.resident(np.ones((256, SIZE // 256), np.uint8))
    start, end = copy.ctypes.data, copy.ctypes.data + copy.nbytes
    huge_kb = 0
    with open("/proc/self/smaps") as smaps:
        inside = False
        for line in smaps:
            if "-" in line.split()[0]:
                lo, hi = (int(a, 16) for a in line.split()[0].split("-"))
                inside = lo < end and hi > start
            elif inside and line.startswith("AnonHugePages:"):
                huge_kb += int(line.split()[1])
    assert huge_kb * 1024 >= 0.9 * SIZE


def test_an_array_of_the_heap_is_copied_and_left_as_it_was():
    # unmapping the pages of private memory would zero them: only a read-only file mapping's are dropped
    weights = np.random.default_rng(1).integers(0, 256, (512, 8192), dtype=np.uint8)
    kept = weights.copy()
    copy = r.resident(weights)
    assert_array_equal(weights, kept)
    assert_array_equal(copy, kept)


def test_a_weight_smaller_than_a_huge_page_stays_where_it_is():
    small = np.zeros((16, 1024), np.uint8)
    assert r.resident(small) is small


def test_the_backend_reads_stacked_experts_in_place_and_copies_the_rest():
    weights = np.zeros((1024, 4096), np.uint8)
    backend = CpuBackend()
    assert backend.upload_weight(8, weights, 1024, 4096, mapped=True).raw is weights
    assert not np.shares_memory(backend.upload_weight(8, weights, 1024, 4096).raw, weights)


@linux
def test_where_huge_pages_come_slowly_the_weights_stay_where_they_are(tmp_path, huge_pages_fast):
    huge_pages_fast.SLOW_BELOW = 1 << 62  # any measured time is slow
    huge_pages_fast.JUDGED_AFTER = 8 << 20
    data, view = _file_view(tmp_path, 1024, SIZE // 1024)
    assert not huge_pages_fast.slow

    assert r.resident(view) is view  # judged on its first chunk: its copy is dropped
    assert huge_pages_fast.slow and huge_pages_fast.bytes == r._CHUNK_BYTES
    assert r.numpy_huge_pages(True) is False  # NumPy's own large arrays stopped asking for huge pages
    assert_array_equal(view, data)
    other = np.ones((64, 1 << 16), np.uint8)
    assert r.resident(other) is other  # once judged, nothing more is copied or touched
    assert huge_pages_fast.bytes == r._CHUNK_BYTES


@linux
def test_numpy_keeps_asking_for_huge_pages_while_they_come_quickly(tmp_path, huge_pages_fast):
    data, view = _file_view(tmp_path, 1024, SIZE // 1024)
    assert r.resident(view) is not view
    assert r.numpy_huge_pages(True) is True


def test_huge_pages_are_judged_on_enough_of_them():
    faults = r.HugePageFaults()
    faults.bytes, faults.seconds = faults.JUDGED_AFTER - 1, 1.0  # slow, but too few to say
    assert not faults.slow
    faults.bytes = faults.JUDGED_AFTER
    assert faults.slow
    faults.seconds = faults.JUDGED_AFTER / faults.SLOW_BELOW / 2  # twice the rate that is slow
    assert not faults.slow
