"""Sidecar updates written off the decoding thread, in submission order.

A turn's end copies its new KV positions out of the cache (persist.snapshot, a memory copy), and a hybrid
model's state (state_persist.StateUpdate), and hands them here, so streaming never waits on the disk. One writer serves the whole process: updates to one file must
land in order even when a conversation is closed and reopened while its last update is still in flight,
and `flush` (before loading or deleting a sidecar) waits for them.

The worker is a non-daemon thread that exits when the queue runs dry, so a normal interpreter exit still
writes what is pending, and an idle process holds no thread.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque

from typing import Protocol

from engine.errors import KvSidecarLocked


class Update(Protocol):
    def write_to(self, path: str) -> bool:
        """Write to the sidecar at `path` (False: the file lost what the update extends)."""


class SidecarWriter:
    def __init__(self):
        self._pending: deque[tuple[str, Update]] = deque()
        self._lock = threading.Condition()
        self._busy = False
        self._stale: dict[str, str] = {}  # path -> why its last update failed

    def submit(self, path: str | os.PathLike, update: Update) -> None:
        with self._lock:
            self._pending.append((os.fspath(path), update))
            start, self._busy = not self._busy, True
        if not start:
            return
        if sys.is_finalizing():  # a reply closed at interpreter exit: no new thread may start now
            self._drain()
            return
        try:
            threading.Thread(target=self._drain, name="fucina-sidecar-writer").start()
        except RuntimeError:  # "can't create new thread at interpreter shutdown"
            self._drain()

    def flush(self) -> None:
        """Wait until every submitted update is on disk (or failed)."""
        with self._lock:
            self._lock.wait_for(lambda: not self._busy)

    def failure(self, path: str | os.PathLike) -> str | None:
        """Why the last update of `path` was not written, without taking it (the owner still will)."""
        with self._lock:
            return self._stale.get(os.fspath(path))

    def take_failure(self, path: str | os.PathLike) -> str | None:
        """Why the last update of `path` was not written (the file keeps its previous complete prefix), once;
        None when it was. The owner then submits a snapshot from position 0."""
        with self._lock:
            return self._stale.pop(os.fspath(path), None)

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._busy = False
                    self._lock.notify_all()
                    return
                path, update = self._pending.popleft()
            failure = self._write(path, update)
            if failure:
                with self._lock:
                    self._stale[path] = failure

    @staticmethod
    def _write(path: str, update: Update) -> str | None:
        try:
            if update.write_to(path):
                return None
            return (f"the sidecar {path} lost positions it held (removed, damaged, or rewritten by another "
                    f"process)")
        except OSError as e:  # a full disk, a removed directory: the file keeps its published prefix
            return f"could not write the sidecar {path}: {e.strerror or e}"
        except KvSidecarLocked as e:  # another process holds it: this update waits for the next snapshot
            return str(e)


# The process's one writer (see the module docstring for why there is one).
WRITER = SidecarWriter()
