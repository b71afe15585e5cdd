"""Numba's on-disk cache, made safe for processes that write it at once.

Numba names a new cache entry's data file after the count of entries in the function's index when it
saves: two processes compiling two signatures of one function at the same time both read the index,
both pick the same file, and the index ends up naming one signature's machine code for the other. A later
run that loads it calls the wrong code with its arguments: wrong numbers, or SIGSEGV/SIGILL, in every
run after, since the cache keeps it. Fucina's warm-up compiles its stages in processes side by side into
one cache (and the app, the CLI and a test's child may compile together), so every index read-and-write
and every load is done holding a lock on a file beside the index.

POSIX uses flock(2), Windows msvcrt.locking; either is dropped by the OS when a process dies. A cache
directory where the lock file cannot be made (read-only) is used without the lock: nothing is saved there.
"""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager

from numba.core.caching import IndexDataCacheFile

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
    import msvcrt


@contextmanager
def _holding(index_path: str):
    try:
        fd = os.open(index_path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            while True:  # LK_LOCK gives up after ten tries a second apart
                try:
                    msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
                    break
                except OSError:
                    continue
        yield
    finally:
        os.close(fd)  # closing drops the lock on either platform


def _locked(method):
    @functools.wraps(method)
    def under_the_lock(self, *args):
        with _holding(self._index_path):
            return method(self, *args)

    return under_the_lock


def install() -> None:
    """Lock every save and load of Numba's index-and-data cache files (once per process)."""
    if getattr(IndexDataCacheFile.save, "__wrapped__", None) is None:
        IndexDataCacheFile.save = _locked(IndexDataCacheFile.save)
        IndexDataCacheFile.load = _locked(IndexDataCacheFile.load)
