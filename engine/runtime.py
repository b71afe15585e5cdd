"""Process-wide engine settings: how many threads the kernels use."""

from __future__ import annotations

import os

import numba

from kernels.cpu import quant

from engine.errors import FucinaError


def configure_threads(n: int | None = None) -> int:
    """Use n threads (else $FUCINA_THREADS, else every core) for the Numba kernels."""
    if n is None:
        env = os.environ.get("FUCINA_THREADS")
        if env:
            try:
                n = int(env)
            except ValueError:
                raise FucinaError(f"FUCINA_THREADS must be a whole number, got {env!r}") from None
    cores = numba.config.NUMBA_NUM_THREADS
    n = cores if n is None else n
    if not 1 <= n <= cores:
        raise FucinaError(f"thread count must be between 1 and {cores}, got {n}")
    quant.set_num_threads(n)  # numba's thread count is per calling thread; quant remembers it for all
    return n
