"""kernels/blas_core.py: OpenBLAS gets its AVX-512 kernels on a CPU that runs them and one thread beside
Numba's, unless the user chose; the products that are OpenBLAS's alone get more threads."""

import os
import subprocess
import sys

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


def test_openblas_keeps_one_thread_when_numpy_was_imported_first():
    """An embedder's program that imports NumPy before the engine: OpenBLAS has already started its pool, too late
    for the variable, so it is limited in place."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", *blas_core._THREAD_VARIABLES)}
    code = ("import numpy, threadpoolctl; import engine; "
            "print(max(i['num_threads'] for i in threadpoolctl.threadpool_info() if i['user_api'] == 'blas'))")
    shown = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "1"


def _blas_threads():
    return max(i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")


def test_openblas_is_lent_threads_for_its_own_products_only(monkeypatch):
    monkeypatch.setattr(blas_core, "_one_thread_ours", True)
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        with blas_core.threads(2):
            assert _blas_threads() == 2
            np.ones((64, 64), np.float32) @ np.ones((64, 64), np.float32)
        assert _blas_threads() == 1


def test_a_prefill_lends_openblas_threads_for_a_long_product_not_for_a_routers(monkeypatch):
    """Its spare threads spin after each call, taking the cores from the kernels next: a MoE router's
    512 x 2048 x 64 F32 product keeps one thread, a dense F32 layer's gets every kernel thread."""
    from gguf.constants import GGMLQuantizationType as T

    from kernels.cpu import quant

    lent = []
    real = blas_core.threads
    monkeypatch.setattr(blas_core, "threads", lambda n: lent.append(n) or real(n))
    monkeypatch.setattr(quant, "threads", lambda: 2)
    rng = np.random.default_rng(0)
    router = rng.standard_normal((64, 2048), dtype=np.float32).view(np.uint8)
    quant.matmul(T.F32, router, rng.standard_normal((512, 2048), dtype=np.float32))
    layer = rng.standard_normal((4096, 1024), dtype=np.float32).view(np.uint8)
    quant.matmul(T.F32, layer, rng.standard_normal((512, 1024), dtype=np.float32))
    assert lent == [1, 2]
