"""Advisory file locks between Fucina processes sharing a data dir.

Two locks are defined: the app holds `app.lock` in the data dir for as long as it runs (one app per data
dir), and a session holds `locks/<conversation id>.lock` beside the history database while a reply streams
into that conversation, in the app and the CLI alike, so a second turn on it elsewhere is refused instead of
interleaving two branches and two sidecar writers.

POSIX uses flock(2), Windows msvcrt.locking; both are released by the OS when the process ends, so a crash
leaves no stale lock. A lock belongs to its open file, so two sessions in one process exclude each other too.
"""

from __future__ import annotations

import os
from pathlib import Path

from engine.errors import ConversationBusy, DataDirInUse
from engine.platform.storage_errors import storage_error

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
    import msvcrt

APP_LOCK = "app.lock"
CONVERSATION_LOCKS = "locks"


class FileLock:
    """A non-blocking exclusive lock on one file (created if missing, never deleted: deleting a lock file
    another process holds would let a third lock a new file of the same name)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """True when this lock is now held (it may have been already); False when someone else holds it.
        A lock file that cannot be created (read-only data dir) is a StoreError."""
        if self._fd is not None:
            return True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise storage_error(e, self.path) from e
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            else:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:  # held elsewhere (EWOULDBLOCK on POSIX, EACCES on Windows)
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the file drops the lock on either platform


def app_lock(data_dir: str | os.PathLike) -> FileLock:
    """The data dir's single-instance lock, held; DataDirInUse when another app holds it."""
    lock = FileLock(Path(data_dir) / APP_LOCK)
    if not lock.try_acquire():
        raise DataDirInUse(f"Fucina is already running on the data dir {data_dir}; switch to that window, or "
                           "set FUCINA_HOME to another data dir to run a second one")
    return lock


def conversation_lock(db_path: str | os.PathLike, conversation_id: str) -> FileLock:
    """The (not yet held) lock a turn on this conversation holds while it streams."""
    return FileLock(Path(db_path).parent / CONVERSATION_LOCKS / f"{conversation_id}.lock")


def busy(conversation_id: str) -> ConversationBusy:
    return ConversationBusy(f"conversation {conversation_id[:8]} is busy: a reply is being written into it by "
                            "another Fucina window or command; try again when that reply has ended")
