"""Tiny synthetic models of every family on the GPU backend against the CPU backend (kernels/wgpu)."""

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from engine.gguf.reader import open_gguf
from engine.models import FAMILIES
from engine.models.transformer import Transformer
from kernels.cpu.backend import CpuBackend
from kernels.wgpu.backend import GpuBackend
from tests.synthetic import write_tiny_model

TOKENS = [5, 17, 99, 3, 64, 64, 21, 8, 120, 1, 77, 40]  # past Gemma's window of 8


def _models(tmp_path, gpu, arch, qtype):
    path = tmp_path / f"{arch}.gguf"
    write_tiny_model(path, arch, qtype=qtype, n_embd=128, n_head=4, n_head_kv=2, n_ff=256)
    file = open_gguf(path)
    args = FAMILIES[arch](file.metadata)
    return Transformer(file, args, CpuBackend()), Transformer(file, args, GpuBackend(gpu))


# F16 weights: both backends multiply f32 activations, so they agree closely; Q8_0 adds the CPU's int8
# activation rounding in its block kernels (llama.cpp's scheme), hence the looser bound. (K-quants are random
# blocks in synthetic models, whose huge logits magnify that rounding; the kernel tests cover their blocks.)
@pytest.mark.parametrize("qtype,tol", [(T.F16, 2e-4), (T.Q8_0, 3e-2)], ids=["F16", "Q8_0"])
# the GPU has no experts op (nor latent attention, nor the hybrids' recurrence, nor Gemma 4's ops) yet
@pytest.mark.parametrize("arch", sorted(set(FAMILIES) - {"qwen3moe", "gpt-oss", "deepseek2", "glm4moe", "qwen35",
                                                         "qwen35moe", "gemma4"}))
def test_prefill_then_decode_matches_the_cpu(tmp_path, gpu, arch, qtype, tol):
    cpu, gpu_model = _models(tmp_path, gpu, arch, qtype)
    logits = {}
    for name, model in (("cpu", cpu), ("gpu", gpu_model)):
        cache = model.new_cache(32)
        prefill = model.forward_all(TOKENS, cache)
        steps = [model.forward([t], cache) for t in (9, 33)]
        logits[name] = np.vstack([prefill, *steps])
    scale = np.abs(logits["cpu"]).max()
    assert np.abs(logits["gpu"] - logits["cpu"]).max() <= tol * scale


def test_rows_are_row_wise_on_the_gpu(tmp_path, gpu):
    """forward_rows, a batched decode and one token at a time give the same bits (each kernel computes a row
    on its own)."""
    _, model = _models(tmp_path, gpu, "qwen2", T.Q8_0)
    one = model.new_cache(32)
    singles = np.stack([model.forward([t], one) for t in TOKENS[:5]])
    rows = model.forward_rows(TOKENS[:5], model.new_cache(32))
    assert np.array_equal(rows, singles)
    a, b = model.new_cache(32), model.new_cache(32)
    model.forward_all(TOKENS[:4], a)
    model.forward_all(TOKENS[:2], b)
    batch = model.decode_batch([TOKENS[4], TOKENS[2]], [a, b])
    assert np.array_equal(batch[0], singles[4])
