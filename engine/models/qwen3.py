"""Qwen3 (dense): no q/k/v biases; per-head RMSNorm on queries and keys before RoPE."""

from typing import Mapping

from engine.models.args import ModelArgs, llama_like

ARCH = "qwen3"


def model_args(meta: Mapping) -> ModelArgs:
    return llama_like(meta, ARCH, qk_norm=True)
