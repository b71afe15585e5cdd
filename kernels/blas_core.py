"""How NumPy's OpenBLAS runs beside the Numba kernels: which kernels it picks, and how many threads it keeps.

Kernels: OpenBLAS picks them for the CPU it recognizes when the library loads; a CPU newer than the build
(here: AMD Zen 5 under OpenBLAS 0.3.31) falls back to its Haswell kernels, AVX2 only, even when the CPU runs
AVX-512: measured 230 vs 440 GFLOP/s for a 512 x 896 x 4864 product on 2 cores. So a CPU with the AVX-512
subsets the SkylakeX kernels use gets those, unless the user chose a core type.

Threads: the engine's threads are Numba's. OpenBLAS's own pool spin-waits after every call, so beside
Numba's it takes the cores the next kernel needs (measured: SmolLM2's 512-token prefill at 385 tok/s with
both pools on 2 cores, 1382 with OpenBLAS on one thread). OpenBLAS therefore keeps one thread, unless the
user set its thread count, and `threads(n)` lends it more for the products that are its alone (prefill of
the formats without an integer kernel: kernels/cpu/quant.py).

Both are meant to be set before NumPy loads OpenBLAS: `kernels` calls `configure_openblas` first, and `engine`
imports `kernels` first. A program that imported NumPy before them gets the one thread through threadpoolctl
instead (its spinning pool made a 21-token Qwen3.5-shape prefill take twice as long); the kernel choice
is then OpenBLAS's own.
"""

from __future__ import annotations

import contextlib
import os
import sys

# the instruction subsets OpenBLAS's SkylakeX kernels are built with
_SKYLAKEX_FEATURES = ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")
_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
_controller = None  # threadpoolctl's view of the loaded BLAS (_blas_controller)
_one_thread_ours = False  # OpenBLAS keeps one thread because configure_openblas said so (not the user)


def configure_openblas() -> None:
    global _one_thread_ours
    if "OPENBLAS_CORETYPE" not in os.environ:
        import llvmlite.binding as llvm  # no NumPy behind it

        features = llvm.get_host_cpu_features()
        if all(features.get(f) for f in _SKYLAKEX_FEATURES):
            os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
    if not any(v in os.environ for v in _THREAD_VARIABLES):
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        _one_thread_ours = True
        if "numpy" in sys.modules:  # an embedder imported NumPy first: OpenBLAS started with a thread a core
            _blas_controller().limit(limits=1, user_api="blas")  # kept: never restored


@contextlib.contextmanager
def threads(n: int):
    """OpenBLAS on n threads meanwhile (one again after), unless the user set its thread count."""
    if not _one_thread_ours or n <= 1:
        yield
        return
    with _blas_controller().limit(limits=n, user_api="blas"):
        yield


def _blas_controller():
    """threadpoolctl's view of the loaded BLAS, made at first use (it scans the loaded libraries)."""
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    return _controller
