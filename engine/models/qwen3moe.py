"""Qwen3 MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (q/k RMSNorm, no biases) and, in every
layer, a Mixture-of-Experts feed-forward: softmax over the experts, the top `expert_used_count`, their
weights normalized to sum to 1 (as llama.cpp runs it: no scale, no shared expert)."""

from dataclasses import replace
from typing import Mapping

from engine.gguf.meta import meta_int, meta_int_opt
from engine.models.args import ModelArgs, llama_like
from engine.models.experts import MoeArgs
from kernels.backend import Gating

ARCH = "qwen3moe"


def model_args(meta: Mapping) -> ModelArgs:
    args = llama_like(meta, ARCH, qk_norm=True)
    n_used = meta_int(meta, ARCH, "expert_used_count")
    # llama.cpp's fallback for files without the expert width: the dense width split over the used experts
    n_ff = (meta_int_opt(meta, ARCH, "expert_feed_forward_length")
            or meta_int(meta, ARCH, "feed_forward_length") // n_used)
    experts = MoeArgs(n_expert=meta_int(meta, ARCH, "expert_count"), n_used=n_used, n_ff=n_ff,
                      gating=Gating.SOFTMAX, normalize=True)
    args.layers = [replace(layer, feed_forward=experts) for layer in args.layers]
    return args
