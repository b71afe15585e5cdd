"""Which OpenBLAS kernels NumPy's sgemm runs (the prefill product past a few rows, see kernels/cpu/quant.py).

OpenBLAS picks its kernels for the CPU it recognizes when the library loads; a CPU newer than the build
(here: AMD Zen 5 under OpenBLAS 0.3.31) falls back to its Haswell kernels, AVX2 only, even when the CPU runs
AVX-512: measured 230 vs 440 GFLOP/s for a 512 x 896 x 4864 product on 2 cores, 1.4x the whole prefill.
So a CPU with the AVX-512 subsets the SkylakeX kernels use gets those, unless the user chose a core type.
It must run before NumPy loads OpenBLAS: `kernels` imports it first, and `engine` imports `kernels` first.
"""

import os

# the instruction subsets OpenBLAS's SkylakeX kernels are built with
_SKYLAKEX_FEATURES = ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")


def prefer_avx512_gemm() -> None:
    if "OPENBLAS_CORETYPE" in os.environ:
        return
    import llvmlite.binding as llvm  # no NumPy behind it

    features = llvm.get_host_cpu_features()
    if all(features.get(f) for f in _SKYLAKEX_FEATURES):
        os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
