"""An exclusive lock on a file, across processes and threads, for the few milliseconds of one sidecar read or
write (engine.kv.persist): two processes writing one conversation's sidecar take turns, so their writes
never interleave.

POSIX: flock(2) on the open file. It belongs to the open file, not the process, so two threads of one
process that each open the file exclude each other too, and the kernel drops it when its holder dies
(SIGKILL included). Windows has no flock: msvcrt.locking on the file's first byte stands in. That lock is
mandatory, so a process that reads the file without taking it fails there; every reader in persist takes
it first. A holder that stops (a stopped process, a hung disk) does not hang the other: after `TIMEOUT_S`
the wait gives up with KvSidecarLocked.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import BinaryIO, Iterator

from engine.errors import KvSidecarLocked

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
    import msvcrt

TIMEOUT_S = 10.0
_POLL_S = 0.005


@contextmanager
def locked(path: str | os.PathLike, *, create: bool = False, write: bool = True) -> Iterator[BinaryIO]:
    """`path` opened (read-write, or read-only without `write`; created empty if missing when `create`)
    and locked until the block ends. Raises FileNotFoundError for a missing file, KvSidecarLocked when
    another holder keeps it past TIMEOUT_S."""
    flags = (os.O_RDWR if write else os.O_RDONLY) | (os.O_CREAT if create else 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags, 0o644)
    try:
        f = os.fdopen(fd, "r+b" if write else "rb")
    except OSError:  # a directory
        os.close(fd)
        raise
    with f:
        deadline = time.monotonic() + TIMEOUT_S
        while not _try_lock(f):
            if time.monotonic() > deadline:
                raise KvSidecarLocked(f"the KV sidecar {os.fspath(path)} stayed locked by another process for "
                                      f"{TIMEOUT_S:.0f} s; close the other Fucina using this conversation")
            time.sleep(_POLL_S)
        try:
            yield f
        finally:
            _unlock(f)


def _try_lock(f: BinaryIO) -> bool:
    if fcntl is not None:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
    f.seek(0)  # msvcrt locks from the current position
    try:
        msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
        return True
    except OSError:
        return False


def _unlock(f: BinaryIO) -> None:
    if f.writable():
        f.flush()  # buffered bytes land while the lock is held
    if fcntl is not None:
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return
    f.seek(0)
    msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)
