"""kernels/blas_core.py: OpenBLAS gets its AVX-512 kernels on a CPU that runs them and one thread beside
Numba's, unless the user chose; the products that are OpenBLAS's alone get more threads."""

import os

import llvmlite.binding as llvm
import numpy as np
import pytest
import threadpoolctl

from kernels import blas_core


@pytest.fixture
def host(monkeypatch):
    # configure_openblas writes os.environ itself, which monkeypatch would not undo: give it a copy, so a
    # child process started by a later test does not inherit OPENBLAS_CORETYPE=SkylakeX (on a CPU without
    # AVX-512 it died of SIGILL at its first product)
    names = ("OPENBLAS_CORETYPE", *blas_core._THREAD_VARIABLES)
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in names})
    monkeypatch.setattr(blas_core, "_one_thread_ours", blas_core._one_thread_ours)

    def with_features(**features):
        monkeypatch.setattr(llvm, "get_host_cpu_features", lambda: features)

    return with_features


def test_an_avx512_cpu_gets_the_skylakex_kernels_and_one_thread(host):
    host(**{f: True for f in blas_core._SKYLAKEX_FEATURES})
    blas_core.configure_openblas()
    assert os.environ["OPENBLAS_CORETYPE"] == "SkylakeX"
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"


def test_a_cpu_without_avx512bw_keeps_openblas_own_choice(host):
    host(avx2=True, avx512f=True, avx512cd=True, avx512dq=True, avx512vl=True)  # no BW: SIGILL if forced
    blas_core.configure_openblas()
    assert "OPENBLAS_CORETYPE" not in os.environ


def test_what_the_user_set_is_kept(host, monkeypatch):
    host(**{f: True for f in blas_core._SKYLAKEX_FEATURES})
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setattr(blas_core, "_one_thread_ours", False)
    blas_core.configure_openblas()
    assert os.environ["OPENBLAS_CORETYPE"] == "Haswell"
    assert "OPENBLAS_NUM_THREADS" not in os.environ
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        with blas_core.threads(2):  # nothing lent: the user's count stands
            assert _blas_threads() == 1


def _blas_threads():
    return max(i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")


def test_openblas_is_lent_threads_for_its_own_products_only(monkeypatch):
    monkeypatch.setattr(blas_core, "_one_thread_ours", True)
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        with blas_core.threads(2):
            assert _blas_threads() == 2
            np.ones((64, 64), np.float32) @ np.ones((64, 64), np.float32)
        assert _blas_threads() == 1
