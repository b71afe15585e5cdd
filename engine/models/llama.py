"""Llama family (SmolLM2, Llama 2/3): SwiGLU, RMSNorm, normal-style RoPE.

llama.cpp's converter permutes the q/k rows of llama checkpoints so that the
"normal" RoPE (adjacent pairs) reproduces the Hugging Face rotation.
"""

from typing import Mapping

from engine.models.args import ModelArgs, llama_like

ARCH = "llama"


def model_args(meta: Mapping) -> ModelArgs:
    return llama_like(meta, ARCH, rope_neox=False)
