"""kernels/blas_core.py: OpenBLAS gets its AVX-512 kernels on a CPU that runs them, unless the user chose."""

import os

import llvmlite.binding as llvm
import pytest

from kernels import blas_core


@pytest.fixture
def host(monkeypatch):
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)

    def with_features(**features):
        monkeypatch.setattr(llvm, "get_host_cpu_features", lambda: features)

    return with_features


def test_an_avx512_cpu_gets_the_skylakex_kernels(host, monkeypatch):
    host(**{f: True for f in blas_core._SKYLAKEX_FEATURES})
    blas_core.prefer_avx512_gemm()
    assert os.environ["OPENBLAS_CORETYPE"] == "SkylakeX"


def test_a_cpu_without_avx512bw_keeps_openblas_own_choice(host):
    host(avx2=True, avx512f=True, avx512cd=True, avx512dq=True, avx512vl=True)  # no BW: SIGILL if forced
    blas_core.prefer_avx512_gemm()
    assert "OPENBLAS_CORETYPE" not in os.environ


def test_a_core_type_the_user_set_is_kept(host, monkeypatch):
    host(**{f: True for f in blas_core._SKYLAKEX_FEATURES})
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    blas_core.prefer_avx512_gemm()
    assert os.environ["OPENBLAS_CORETYPE"] == "Haswell"
