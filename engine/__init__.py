import kernels  # noqa: F401 (first, so that OpenBLAS loads with the kernels kernels/blas_core.py chose)
