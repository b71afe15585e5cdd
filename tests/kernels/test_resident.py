"""kernels/cpu/resident.py: a weight read at every token is copied once into huge-page-backed memory, the
process then holds its bytes once (the file's pages it read are unmapped again), and a weight that is not a
view of a read-only file mapping is copied without being touched."""

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
