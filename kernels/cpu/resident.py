"""Weights the kernels read at every token, copied once at load into memory backed by huge pages.

A weight mapped from its file is read from the page cache wherever the system put its pages: scattered 4 KB
pages, at whose every boundary the hardware prefetchers stop and a new page walk starts. The kernels then
stream it well below the memory's speed: Qwen3.5-35B-A3B's attn_qkv (Q4_K, 8192 x 2048) times one row ran at
12-14 GB/s on two cores read from its file's pages, at 20 GB/s from 2 MB pages, the same bytes (AVX-512 Xeon).
How a file's pages lie depends on how it was written and read before, so the decode speed did too.

So every weight of a huge page or more is copied into a private anonymous mapping advised MADV_HUGEPAGE, and
the file's pages the copy read are dropped from this process's page tables again (MADV_DONTNEED on a
read-only shared file mapping unmaps them; the page cache keeps them): the process holds each weight once, as
it did when it read them in place. Smaller weights stay views of the file. A MoE's stacked experts are not
copied (the backend's upload is told so): a token reads a few of them, and together they may not fit memory.
Where the system has no MADV_HUGEPAGE (not Linux) the weights stay views of the file.

Nor where huge pages come slowly. A VM whose host takes back the memory its guest frees (free page reporting,
in 2 MB blocks: cloud VMs, WSL2) has every fresh huge page faulted in from the host: up to 14 s a GB measured
on such a VM (0.8 s on another day), which turned the Qwen3.5 shape's 0.8 s load into 15 s for a decode 10%
faster. So the time to fault in each chunk's huge pages is kept, and once the first 32 MB came slower than
1 GB/s the process copies no more weights (those copied stay), and NumPy stops advising huge pages for its own
large arrays (it does from 4 MB): on that VM the 132 MB of a Qwen3.5-shape chat's states, allocated at each
reopen, took from 0.02 s to 1.5 s in huge pages, 0.05 s in 4 KB pages.
"""

from __future__ import annotations

import ctypes
import mmap
import time
from functools import cache

import numpy as np

HUGE_PAGE = 2 << 20
_PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4  # Linux's, as mmap.MADV_DONTNEED (absent on some Pythons' builds)
_CHUNK_BYTES = 32 << 20


class HugePageFaults:
    """How fast this process has been given fresh huge pages: slow once JUDGED_AFTER bytes came slower than
    SLOW_BELOW bytes a second."""

    JUDGED_AFTER = 32 << 20
    SLOW_BELOW = 1 << 30

    def __init__(self):
        self.bytes, self.seconds = 0, 0.0

    @property
    def slow(self) -> bool:
        return self.bytes >= self.JUDGED_AFTER and self.bytes < self.SLOW_BELOW * self.seconds

    def fault_in(self, memory: np.ndarray) -> bool:
        """Write a byte of each huge page of `memory` (the kernel then gives it one), timed; False once they
        come slowly (and then NumPy's arrays no longer ask for them)."""
        t0 = time.perf_counter()
        memory.reshape(-1)[::HUGE_PAGE] = 0
        self.seconds += time.perf_counter() - t0
        self.bytes += memory.nbytes
        if self.slow:
            numpy_huge_pages(False)
        return not self.slow


def numpy_huge_pages(advise: bool) -> bool:
    """Whether NumPy advises huge pages for the large arrays it allocates from now on; returns what it did."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import _set_madvise_hugepage
    return _set_madvise_hugepage(advise)


_faults = HugePageFaults()


def resident(raw: np.ndarray) -> np.ndarray:
    """raw (a weight's bytes, a view of the file's mapping) as a read-only copy in huge-page-backed memory;
    raw itself where it is smaller than a huge page, or the system cannot advise huge pages or gives them
    slowly."""
    if raw.nbytes < HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE") or _faults.slow:
        return raw
    region = mmap.mmap(-1, raw.nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory = np.frombuffer(region, np.uint8)  # keeps the mapping alive as long as any view of it
    start = -memory.ctypes.data % HUGE_PAGE  # huge pages back only whole aligned 2 MB spans
    region.madvise(mmap.MADV_HUGEPAGE, start, raw.nbytes)
    copy = memory[start : start + raw.nbytes].reshape(raw.shape)
    unmap = _in_read_only_mapping(raw)
    step = max(1, _CHUNK_BYTES * len(raw) // raw.nbytes)  # rows (raw: uint8 [rows, row bytes])
    for r0 in range(0, len(raw), step):  # in chunks, so the process holds at most a chunk twice
        if not _faults.fault_in(copy[r0 : r0 + step]):
            return raw  # the copy is dropped with its mapping; the view's pages are the page cache's still
        np.copyto(copy[r0 : r0 + step], raw[r0 : r0 + step])
        if unmap:
            _unmap_pages_of(raw[r0 : r0 + step])
    copy.flags.writeable = False
    return copy


def _in_read_only_mapping(view: np.ndarray) -> bool:
    """Whether view's bytes are a read-only mmap's (the file's): unmapping those loses nothing, where
    MADV_DONTNEED on private or anonymous memory would zero it."""
    root = view
    while isinstance(root, np.ndarray) and root.base is not None:
        root = root.base
    if isinstance(root, memoryview):  # np.frombuffer's base: a view of the buffer it was given
        root = root.obj
    return isinstance(root, mmap.mmap) and not view.flags.writeable


def _unmap_pages_of(view: np.ndarray) -> None:
    """Drop the whole pages under `view` from this process's page tables."""
    first = -(-view.ctypes.data // _PAGE) * _PAGE
    end = (view.ctypes.data + view.nbytes) // _PAGE * _PAGE
    if end > first:
        _libc().madvise(ctypes.c_void_p(first), ctypes.c_size_t(end - first), _MADV_DONTNEED)


@cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)
