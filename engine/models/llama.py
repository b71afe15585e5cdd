"""Llama family (SmolLM2, Llama 2/3): SwiGLU, RMSNorm, normal-style RoPE.

llama.cpp's converter permutes the q/k rows of llama checkpoints so that the
"normal" RoPE (adjacent pairs) reproduces the Hugging Face rotation.
"""

from engine.gguf.reader import GGUFFile
from engine.models.args import common_args
from engine.models.transformer import Transformer

ARCH = "llama"


def build(file: GGUFFile) -> Transformer:
    return Transformer(file, common_args(file.metadata, ARCH, rope_neox=False))
