"""Large temporaries from the heap, used again, rather than fresh mappings at every allocation (glibc).

A prefill allocates tens of MB per layer and frees them before the next (a MoE layer's 4,096 routed rows:
32 MB of inputs and as much of outputs). glibc maps an allocation past its mmap threshold (which adapts, but
never past 32 MB) afresh each time: every page faults in zeroed at first touch and goes back at free. The
Qwen3.5-35B-A3B shape's 512-token prefill spent 1.3 s of 8.7 in those faults. With the threshold raised, such
allocations come from the heap, whose pages stay mapped; free memory at the heap's top past the trim threshold
still goes back to the system, so an idle engine keeps at most that much more than it holds.
"""

from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 1 << 30   # allocations from 1 GB are still mapped (a long context's KV buffers)
TRIM_THRESHOLD = 256 << 20


def reuse_large_allocations() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; False where there is no glibc to tell."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # a libc without mallopt (musl)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
