"""Backends say which ops of the seam they run (kernels.backend.OPS): today each runs them all, and none
claims an op it does not know."""

import pytest

from kernels.backend import OPS, Backend
from kernels.cpu.backend import CpuBackend


def _runs_every_op_and_no_other(backend) -> None:
    assert all(backend.supports_op(op) for op in OPS)
    assert not backend.supports_op("mixture_of_experts")
    assert not backend.supports_op("")


def test_every_op_name_is_a_method_of_the_protocol():
    assert all(callable(getattr(Backend, op, None)) for op in OPS)


def test_the_cpu_runs_every_op():
    _runs_every_op_and_no_other(CpuBackend())


def test_cuda_runs_every_op():
    cuda = pytest.importorskip("kernels.cuda.backend", reason="numba-cuda is not installed")
    _runs_every_op_and_no_other(cuda.CudaBackend())  # its answer needs no device


def test_wgpu_runs_every_op(gpu):
    from kernels.wgpu.backend import GpuBackend

    _runs_every_op_and_no_other(GpuBackend(gpu))
