"""gpt-oss (OpenAI's gpt-oss-20b and -120b; llama.cpp's LLM_ARCH_OPENAI_MOE): attention with biases on q/k/v
and the output, a learned sink logit per head, YaRN-scaled NeoX RoPE, sliding-window (even) and global (odd)
layers; in every layer a Mixture-of-Experts with a biased router, the top `expert_used_count` logits softmaxed
among themselves, biased experts and the clamped SwiGLU (swiglu_oai). The feed-forward's pre-norm is named
post_attention_norm.

As llama.cpp reads the metadata: `attention.sliding_window` is required, the pattern defaults to 2 (every
other layer global), the sliding layers' RoPE base is `rope.freq_base_swa` (default: `rope.freq_base`), and
the experts' weights are not scaled.
"""

from dataclasses import replace
from typing import Mapping

from engine.gguf.meta import meta_float_opt, meta_int
from engine.models.args import ModelArgs, llama_like, rope_scaling, sliding_layers
from engine.models.experts import MoeArgs
from kernels.backend import SWIGLU_OAI, Gating

ARCH = "gpt-oss"
DEFAULT_PATTERN = 2


def model_args(meta: Mapping) -> ModelArgs:
    window = meta_int(meta, ARCH, "attention.sliding_window")
    sliding = sliding_layers(meta, ARCH, meta_int(meta, ARCH, "block_count"), DEFAULT_PATTERN)
    base = meta_float_opt(meta, ARCH, "rope.freq_base", default=10000.0)
    swa_base = meta_float_opt(meta, ARCH, "rope.freq_base_swa", default=base)
    args = llama_like(meta, ARCH, qkv_bias=True, window=[window if s else 0 for s in sliding],
                      rope_base=[swa_base if s else base for s in sliding], out_bias=True, sinks=True,
                      rope_scaling=rope_scaling(meta, ARCH))
    experts = MoeArgs(n_expert=meta_int(meta, ARCH, "expert_count"), n_used=meta_int(meta, ARCH, "expert_used_count"),
                      n_ff=meta_int(meta, ARCH, "expert_feed_forward_length"), gating=Gating.SOFTMAX_WEIGHT,
                      normalize=False, activation=SWIGLU_OAI, biases=True)
    args.layers = [replace(layer, feed_forward=experts, ffn_norm="post_attention_norm.weight") for layer in args.layers]
    return args
