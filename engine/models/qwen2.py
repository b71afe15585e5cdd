"""Qwen2 / Qwen2.5: the llama block with q/k/v biases and NeoX-style RoPE."""

from typing import Mapping

from engine.models.args import ModelArgs, llama_like

ARCH = "qwen2"


def model_args(meta: Mapping) -> ModelArgs:
    return llama_like(meta, ARCH, qkv_bias=True)
