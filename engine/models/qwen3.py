"""Qwen3 (dense): no q/k/v biases; per-head RMSNorm on queries and keys before RoPE."""

from engine.gguf.reader import GGUFFile
from engine.models.args import common_args
from engine.models.transformer import Transformer

ARCH = "qwen3"


def build(file: GGUFFile) -> Transformer:
    return Transformer(file, common_args(file.metadata, ARCH, qk_norm=True))
