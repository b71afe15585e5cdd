"""Turning the disk's failures (SQLite's and the OS's) into StoreError subclasses that say what to do.

SQLite reports a full disk as SQLITE_FULL, a file size limit or a failing disk as SQLITE_IOERR, and a
read-only file or directory as SQLITE_READONLY / SQLITE_CANTOPEN / SQLITE_PERM; the OS says ENOSPC, EFBIG,
EROFS, EACCES or EPERM.
"""

from __future__ import annotations

import errno
import os
import sqlite3

from engine.errors import StorageFull, StorageReadOnly, StoreError

# SQLite's primary result codes (the low byte of an extended code).
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 3, 5, 6, 8
_SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 10, 11, 13, 14, 26

_FULL_ERRNOS = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}
_READ_ONLY_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM}


def full(path: str | os.PathLike, detail: str) -> StorageFull:
    return StorageFull(f"cannot write {os.fspath(path)}: {detail}; free some disk space and retry "
                       "(nothing saved before was lost)")


def read_only(path: str | os.PathLike, detail: str) -> StorageReadOnly:
    return StorageReadOnly(f"cannot write {os.fspath(path)}: {detail}; make it and its folder writable, or set "
                           "FUCINA_HOME to a writable data dir")


def storage_error(error: sqlite3.Error | OSError, path: str | os.PathLike) -> StoreError:
    """The StoreError for `error`, raised while writing (or opening) `path`."""
    if isinstance(error, OSError):
        detail = error.strerror or str(error)
        if error.errno in _FULL_ERRNOS:
            return full(path, detail)
        if error.errno in _READ_ONLY_ERRNOS:
            return read_only(path, detail)
        return StoreError(f"cannot write {os.fspath(path)}: {detail}")
    code = getattr(error, "sqlite_errorcode", None)
    primary = code & 0xFF if code is not None else None
    detail = str(error)
    if primary == _SQLITE_FULL:
        return full(path, detail)
    if primary == _SQLITE_IOERR:
        return StoreError(f"cannot write {os.fspath(path)}: {detail}; the disk may be full (or a file size limit "
                          "reached) or failing: free some space and retry (nothing saved before was lost)")
    if primary in (_SQLITE_READONLY, _SQLITE_CANTOPEN, _SQLITE_PERM):
        return read_only(path, detail)
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return StoreError(f"{os.fspath(path)} is locked by another program ({detail}); retry in a moment")
    if primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return StoreError(f"{os.fspath(path)} is not a readable history database ({detail}); move it aside "
                          "and Fucina starts a new one")
    return StoreError(f"cannot use {os.fspath(path)}: {detail}")
