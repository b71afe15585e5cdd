"""Process-wide engine settings: how many threads the kernels use, and which backend runs them."""

from __future__ import annotations

import os
from typing import Callable

import numba

from kernels.backend import BACKENDS  # noqa: F401 (the names the app offers)
from kernels.backend import Backend, cpu_backend, select_backend, set_kernel_threads

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
    set_kernel_threads(n)  # numba's thread count is per calling thread; the kernels remember it for all
    return n


_backend: Backend | None = None  # None: the CPU, until a command or the app chooses


def configure_backend(name: str = "auto", on_fallback: Callable[[str], None] | None = None) -> Backend:
    """Run models loaded from now on on the backend `name` ("auto", "cpu", "cuda", "gpu"); one that cannot
    start falls back to the CPU and `on_fallback` gets the message saying why."""
    global _backend
    _backend = select_backend(name, on_fallback)
    return _backend


def model_backend() -> Backend:
    """The backend load_model puts a model on."""
    return _backend or cpu_backend()
