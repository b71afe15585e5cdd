"""Numba CPU kernels.

GNU OpenMP (Numba's threading layer here) spins for a long time after each
parallel region by default; when another process holds a core, every threaded
kernel call then stalls for a scheduler tick (~8 ms measured). A short spin
keeps back-to-back kernel launches fast on an idle machine without that stall.
It must be set before the OpenMP runtime starts, hence here.

Numba's on-disk cache checks only the source file of the function it caches, not
the helpers it inlined from other files, so an edited or upgraded helper could run
stale machine code. The cache therefore lives in a directory named after a hash of
all the kernel sources (unless NUMBA_CACHE_DIR says otherwise); it must be set
before any kernel is decorated, hence here too, as must the lock that keeps the cache
whole when processes compile into it side by side (cache_lock).
"""

import hashlib
import os
from pathlib import Path

if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "20000"

import numba  # noqa: E402 (after the OpenMP setting)
import platformdirs  # noqa: E402

from kernels.cpu import cache_lock  # noqa: E402


def _sources_hash() -> str:
    h = hashlib.sha256()
    for source in sorted(Path(__file__).parent.glob("*.py")):
        h.update(source.name.encode() + b"\0" + source.read_bytes())
    return h.hexdigest()[:16]


# Names this build of the kernels: what was measured of them (speculation's verify costs) is kept under it.
BUILD_ID = _sources_hash()

if "NUMBA_CACHE_DIR" not in os.environ:
    numba.config.CACHE_DIR = str(Path(platformdirs.user_cache_dir("fucina", appauthor=False)) / "numba"
                                 / BUILD_ID)
cache_lock.install()
