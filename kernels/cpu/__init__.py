"""Numba CPU kernels.

GNU OpenMP (Numba's threading layer here) spins for a long time after each
parallel region by default; when another process holds a core, every threaded
kernel call then stalls for a scheduler tick (~8 ms measured). A short spin
keeps back-to-back kernel launches fast on an idle machine without that stall.
It must be set before the OpenMP runtime starts, hence here. The kernels' large
temporaries come from the heap, used again, rather than from fresh mappings (heap.py).

The kernels compile into the Numba cache that kernels.common sets up, named after
its sources and these (they inline its codecs); importing it here sets the cache up
before any kernel of this package is decorated.
"""

import os

if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "20000"

import kernels.common  # noqa: E402, F401 (after the OpenMP setting: it imports Numba)
from kernels.cpu.heap import reuse_large_allocations  # noqa: E402

reuse_large_allocations()
