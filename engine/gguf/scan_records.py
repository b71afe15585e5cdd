"""Verdicts on a model file that cost a read of all of it, remembered per version of the file.

The scan of a file's floats for NaN or Inf (engine.gguf.finite) reads every byte: a second or more for a
few GB in the page cache, minutes for a 17 GB MoE model from disk, at every load. A file that passed is
recorded in the cache directory under a hash of its resolved path, with what identifies this version of
it (size, modification and change times in ns, inode and device: writing the file changes its change
time, which no one can set back), so an unchanged file is not scanned again; a changed, replaced or moved
file is. A record that is missing, torn or unreadable only costs a scan.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from engine.platform.paths import cache_dir


def _record_path(path: Path, check: str) -> Path:
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]
    return cache_dir() / "scanned" / f"{key}-{check}.json"


def _version(st: os.stat_result) -> dict:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino,
            "dev": st.st_dev}


def passed_before(path: Path, st: os.stat_result, check: str) -> bool:
    """Whether the file at `path`, now as `st` describes it, passed `check` in this version."""
    try:
        return json.loads(_record_path(path, check).read_text()) == _version(st)
    except (OSError, ValueError):
        return False


def record_pass(path: Path, st: os.stat_result, check: str) -> None:
    """Record that the file as `st` described it (taken before the check read it) passed `check`; a cache
    that cannot be written only costs the next load a scan."""
    record = _record_path(path, check)
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(_version(st)))
    except OSError:
        pass
