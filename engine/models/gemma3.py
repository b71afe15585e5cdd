"""Gemma 3: interleaved sliding-window and global layers, each with its own RoPE base;
q/k norms; norms after attention and FFN too; GeGLU; embeddings scaled by sqrt(n_embd).

As in llama.cpp: every `sliding_window_pattern`-th layer (default 6) is global and
uses `rope.freq_base`; the others see a window of `attention.sliding_window`
keys and use RoPE base 10000. The GGUF norm weights already include Gemma's +1.
"""

import math
from typing import Mapping

from engine.gguf.meta import meta_float_opt, meta_int, meta_int_opt
from engine.models.args import ModelArgs, llama_like, sliding_layers

ARCH = "gemma3"
LOCAL_ROPE_BASE = 10000.0
DEFAULT_PATTERN = 6


def model_args(meta: Mapping) -> ModelArgs:
    window = meta_int_opt(meta, ARCH, "attention.sliding_window") or 0
    global_base = meta_float_opt(meta, ARCH, "rope.freq_base", default=1_000_000.0)
    glob = [not s for s in sliding_layers(meta, ARCH, meta_int(meta, ARCH, "block_count"), DEFAULT_PATTERN)]
    return llama_like(meta, ARCH, activation="gelu", qk_norm=True, post_norms=True,
                      window=[0 if g else window for g in glob],
                      rope_base=[global_base if g else LOCAL_ROPE_BASE for g in glob],
                      embed_scale=math.sqrt(meta_int(meta, ARCH, "embedding_length")))
