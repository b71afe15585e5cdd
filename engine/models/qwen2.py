"""Qwen2 / Qwen2.5: the llama block with q/k/v biases and NeoX-style RoPE."""

from engine.gguf.reader import GGUFFile
from engine.models.args import common_args
from engine.models.transformer import ModelArgs

ARCH = "qwen2"


def model_args(file: GGUFFile) -> ModelArgs:
    return common_args(file.metadata, ARCH, qkv_bias=True)
