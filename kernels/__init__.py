from kernels.blas_core import configure_openblas

configure_openblas()
