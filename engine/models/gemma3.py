"""Gemma 3: interleaved sliding-window and global layers, each with its own RoPE base;
q/k norms; norms after attention and FFN too; GeGLU; embeddings scaled by sqrt(n_embd).

As in llama.cpp: every `sliding_window_pattern`-th layer (default 6) is global and
uses `rope.freq_base`; the others see a window of `attention.sliding_window`
keys and use RoPE base 10000. The GGUF norm weights already include Gemma's +1.
"""

import math
from typing import Mapping

import numpy as np

from engine.errors import ConfigError
from engine.gguf.meta import meta_float_opt, meta_int, meta_int_opt, per_layer
from engine.models.args import ModelArgs, llama_like

ARCH = "gemma3"
LOCAL_ROPE_BASE = 10000.0
DEFAULT_PATTERN = 6


def is_global_layer(layer: int, pattern: int) -> bool:
    return pattern <= 0 or layer % pattern == pattern - 1


def global_layers(meta, n_layers: int) -> list[bool]:
    """Which layers attend globally: `attention.sliding_window_pattern` is a period (every pattern-th layer;
    default 6) or, as llama.cpp also reads it, one flag per layer (nonzero: sliding)."""
    key = f"{ARCH}.attention.sliding_window_pattern"
    if isinstance(meta.get(key), (list, np.ndarray)):
        flags = per_layer(meta, key, n_layers)
        if not all(isinstance(f, (bool, int)) for f in flags):
            raise ConfigError(f"model metadata {key} must be a period or one flag per layer")
        return [not f for f in flags]
    pattern = meta_int_opt(meta, ARCH, "attention.sliding_window_pattern") or DEFAULT_PATTERN
    return [is_global_layer(i, pattern) for i in range(n_layers)]


def model_args(meta: Mapping) -> ModelArgs:
    window = meta_int_opt(meta, ARCH, "attention.sliding_window") or 0
    global_base = meta_float_opt(meta, ARCH, "rope.freq_base", default=1_000_000.0)
    glob = global_layers(meta, meta_int(meta, ARCH, "block_count"))
    return llama_like(meta, ARCH, activation="gelu", qk_norm=True, post_norms=True,
                      window=[0 if g else window for g in glob],
                      rope_base=[global_base if g else LOCAL_ROPE_BASE for g in glob],
                      embed_scale=math.sqrt(meta_int(meta, ARCH, "embedding_length")))
