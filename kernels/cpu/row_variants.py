"""A row-wise kernel in two compiled variants: the decode one first, the verify one in the background after.

A format set with the lanes (kernels.common.formats) compiles the vector-lane code for many rows (row_lanes,
attention_lanes) into the forward. A one-row decode never runs that code, and compiling it before the
first reply made a fresh kernel cache wait about half again as long for the first token. So a call of one
row runs the variant without the lanes, and a call of more rows the variant with them once it is
compiled: the first that asks starts its compilation on a background thread (or loads it from the kernel
cache, where the warm-up's verify stage left it) and, until it is ready, calls run the decode variant.
Every row's arithmetic is a one-row step's in both, so the bits are the same and only the speed differs.
"""

from __future__ import annotations

import logging
import threading

from numba import typeof

from kernels.common import formats

log = logging.getLogger(__name__)

# False: every call runs the verify variant, compiled at the first call (the test suite: one compilation
# per format set instead of two; tests/kernels/test_row_variants.py and the warm-up's tests cover the split)
SEPARATE_DECODE = True


class RowVariants:
    """`kernel(formats, *args)` for the formats `qtypes`, in its decode and verify variants."""

    def __init__(self, kernel, qtypes):
        self.kernel = kernel
        self.decode = formats.of(qtypes, lanes=False)
        self.verify = formats.of(qtypes, lanes=True)
        self._ready: set[tuple] = set()      # the argument types whose verify variant is compiled
        self._compiling: dict[tuple, threading.Thread] = {}
        self._lock = threading.Lock()

    def formats_for(self, rows: int, args: tuple) -> formats.FormatSet:
        """The format set a call of `rows` rows with `args` (after the format set) runs now."""
        if not SEPARATE_DECODE:
            return self.verify
        if rows == 1:
            return self.decode
        return self.verify if self.ready(args) else self.decode

    def ready(self, args: tuple, wait: bool = False) -> bool:
        """Whether the verify variant for `args` is compiled; asking starts its compilation (wait: and waits
        for it)."""
        if not SEPARATE_DECODE:
            return True  # it compiles at its first call
        key = tuple(typeof(a) for a in args)
        if key in self._ready:
            return True
        with self._lock:
            thread = self._compiling.get(key)
            if thread is None:
                thread = threading.Thread(target=self._compile, args=(key,), name="verify-kernels", daemon=True)
                self._compiling[key] = thread
                thread.start()
        if wait:
            thread.join()
        return key in self._ready

    def _compile(self, key: tuple) -> None:
        try:
            self.kernel.compile((typeof(self.verify), *key))
        except Exception:  # the decode variant serves every call; only speed is lost
            log.exception("the verify kernels did not compile; verify steps run the decode kernels")
            return
        self._ready.add(key)
