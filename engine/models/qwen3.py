"""Qwen3 (dense): no q/k/v biases; per-head RMSNorm on queries and keys before RoPE."""

from engine.gguf.reader import GGUFFile
from engine.models.args import common_args
from engine.models.transformer import ModelArgs

ARCH = "qwen3"


def model_args(file: GGUFFile) -> ModelArgs:
    return common_args(file.metadata, ARCH, qk_norm=True)
