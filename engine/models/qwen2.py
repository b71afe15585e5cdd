"""Qwen2 / Qwen2.5: the llama block with q/k/v biases and NeoX-style RoPE."""

from engine.gguf.reader import GGUFFile
from engine.models.args import common_args
from engine.models.transformer import Transformer

ARCH = "qwen2"


def build(file: GGUFFile) -> Transformer:
    return Transformer(file, common_args(file.metadata, ARCH, qkv_bias=True))
