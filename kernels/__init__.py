from kernels.blas_core import prefer_avx512_gemm

prefer_avx512_gemm()
