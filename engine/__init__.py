import kernels  # noqa: F401 (first, so that OpenBLAS loads as kernels/blas_core.py configures it)
