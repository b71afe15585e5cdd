"""Backends say which ops of the seam they run (kernels.backend.OPS): the CPU runs them all, the devices all but
the experts' (moe_ffn), latent attention (DeepSeek's), the Gated DeltaNet recurrence (Qwen3.5's), Gemma 4's scale
and the variants of attention, RoPE and the gated product that gpt-oss, Qwen3.5 and Gemma 4 need, and none claims an
op it does not know."""

import pytest

from kernels.backend import OP_DELTA_NET, OP_LATENT_ATTENTION, OP_MOE_FFN, OP_SCALE, OP_VARIANTS, OPS, Backend
from kernels.cpu.backend import CpuBackend


def _runs_every_op_and_no_other(backend, refused: frozenset = frozenset()) -> None:
    assert all(backend.supports_op(op) for op in OPS - refused)
    assert not any(backend.supports_op(op) for op in refused)
    assert not backend.supports_op("mixture_of_experts")
    assert not backend.supports_op("")


DEVICES_LACK = frozenset({OP_MOE_FFN, OP_LATENT_ATTENTION, OP_DELTA_NET, OP_SCALE, *OP_VARIANTS})


def test_every_op_name_is_a_method_of_the_protocol_or_a_variant_of_one():
    assert all(callable(getattr(Backend, OP_VARIANTS.get(op, op), None)) for op in OPS)


def test_the_cpu_runs_every_op():
    _runs_every_op_and_no_other(CpuBackend())


def test_cuda_runs_every_op_but_the_experts_and_the_variants():
    cuda = pytest.importorskip("kernels.cuda.backend", reason="numba-cuda is not installed")
    _runs_every_op_and_no_other(cuda.CudaBackend(), DEVICES_LACK)  # its answer needs no device


def test_wgpu_runs_every_op_but_the_experts_and_the_variants(gpu):
    from kernels.wgpu.backend import GpuBackend

    _runs_every_op_and_no_other(GpuBackend(gpu), DEVICES_LACK)
