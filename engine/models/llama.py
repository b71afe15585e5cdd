"""Llama family (SmolLM2, Llama 2/3): SwiGLU, RMSNorm, normal-style RoPE.

llama.cpp's converter permutes the q/k rows of llama checkpoints so that the
"normal" RoPE (adjacent pairs) reproduces the Hugging Face rotation.
"""

from engine.gguf.reader import GGUFFile
from engine.models.args import common_args
from engine.models.transformer import ModelArgs

ARCH = "llama"


def model_args(file: GGUFFile) -> ModelArgs:
    return common_args(file.metadata, ARCH, rope_neox=False)
