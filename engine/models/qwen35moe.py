"""Qwen3.5 MoE (Qwen3.5-35B-A3B; llama.cpp's qwen35moe): Qwen3.5's hybrid of Gated DeltaNet and gated attention
layers (engine.models.qwen35) with a Mixture-of-Experts feed-forward in every layer: softmax over the experts,
the top `expert_used_count`, their weights normalized (and scaled where `expert_weights_scale` says), plus a
shared expert (`expert_shared_feed_forward_length` wide, default the dense width) whose output is times the
sigmoid of its own gate, one value per row (ffn_gate_inp_shexp)."""

from dataclasses import replace
from typing import Mapping

from engine.gguf.meta import meta_float_opt, meta_int, meta_int_opt
from engine.models import qwen35
from engine.models.args import ModelArgs
from engine.models.experts import MoeArgs
from kernels.backend import Gating

ARCH = "qwen35moe"


def model_args(meta: Mapping) -> ModelArgs:
    args = qwen35.model_args(meta, ARCH)
    n_used = meta_int(meta, ARCH, "expert_used_count")
    n_ff = (meta_int_opt(meta, ARCH, "expert_feed_forward_length")
            or meta_int(meta, ARCH, "feed_forward_length") // n_used)
    scale = meta_float_opt(meta, ARCH, "expert_weights_scale", 0.0)
    experts = MoeArgs(n_expert=meta_int(meta, ARCH, "expert_count"), n_used=n_used, n_ff=n_ff,
                      gating=Gating.SOFTMAX, normalize=True, scale=scale if scale not in (0.0, 1.0) else 1.0,
                      n_shared_ff=(meta_int_opt(meta, ARCH, "expert_shared_feed_forward_length")
                                   or meta_int(meta, ARCH, "feed_forward_length")),
                      shared_gate=True)
    args.layers = [replace(layer, feed_forward=experts) for layer in args.layers]
    args.next_token_layers = [replace(layer, feed_forward=experts) for layer in args.next_token_layers]
    return args
