"""DeepSeek-V2/V3 (llama.cpp's deepseek2: DeepSeek-V2-Lite, V2.5, V3, R1, Kimi K2 and their kin): latent
attention (engine.models.latent_attention) in every layer, a dense gated MLP in the first
`leading_dense_block_count` layers and a Mixture-of-Experts after them (engine.models.experts.routed_experts:
shared experts, softmax or sigmoid gating, the selection bias exp_probs_b, group-limited routing, the weights
normalized and scaled as the metadata says; softmax where `expert_gating_func` is unset, as V2 files leave it).

As llama.cpp reads the metadata: the MLA head sizes are `attention.key_length_mla` (RoPE'd and not) and
`attention.value_length_mla`; files without them hold the older unsplit attn_kv_b and give the head sizes as
`attention.key_length` and `value_length` (llama.cpp runs those as plain multi-head attention over expanded
keys and values; this family splits attn_kv_b at load and caches the latent all the same); RoPE pairs are the
normal ones; YaRN's magnitude and the attention scale follow `rope.scaling.yarn_log_multiplier` (stored as 0.1
times DeepSeek's mscale_all_dim).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import numpy as np

from engine.gguf.meta import ZeroPolicy, meta_float, meta_float_opt, meta_int, meta_int_opt
from engine.models.args import ModelArgs, rope_scaling, vocab_size
from engine.models.block import LayerArgs
from engine.models.experts import routed_experts
from engine.models.feed_forward import GatedMlpArgs
from engine.models.latent_attention import LatentAttentionArgs
from kernels.backend import Gating, RopeScaling

ARCH = "deepseek2"


def model_args(meta: Mapping) -> ModelArgs:
    n_layers = meta_int(meta, ARCH, "block_count")
    n_embd = meta_int(meta, ARCH, "embedding_length")
    n_dense = meta_int_opt(meta, ARCH, "leading_dense_block_count", ZeroPolicy.ACCEPT_ZERO) or 0
    mixer = _latent_attention(meta)
    dense = GatedMlpArgs(meta_int(meta, ARCH, "feed_forward_length"))
    experts = routed_experts(meta, ARCH, unset_gating=Gating.SOFTMAX) if n_dense < n_layers else None
    return ModelArgs(arch=ARCH, n_embd=n_embd, vocab_size=vocab_size(meta, ARCH),
                     norm_eps=meta_float(meta, ARCH, "attention.layer_norm_rms_epsilon"),
                     context_length=meta_int_opt(meta, ARCH, "context_length") or 4096,
                     layers=[LayerArgs(mixer, dense if i < n_dense else experts) for i in range(n_layers)])


def _latent_attention(meta: Mapping) -> LatentAttentionArgs:
    key_mla = meta_int_opt(meta, ARCH, "attention.key_length_mla")
    value_mla = meta_int_opt(meta, ARCH, "attention.value_length_mla")
    split = key_mla is not None and value_mla is not None
    if not split:  # an older file: the head sizes are the plain keys', its attn_kv_b unsplit
        key_mla = meta_int(meta, ARCH, "attention.key_length")
        value_mla = meta_int(meta, ARCH, "attention.value_length")
    rope_dims = meta_int(meta, ARCH, "rope.dimension_count")
    scaling = _rope_scaling(meta)
    return LatentAttentionArgs(
        n_head=meta_int(meta, ARCH, "attention.head_count"), rank=meta_int(meta, ARCH, "attention.kv_lora_rank"),
        nope=key_mla - rope_dims, rope_dims=rope_dims, v_dim=value_mla,
        q_rank=meta_int_opt(meta, ARCH, "attention.q_lora_rank", ZeroPolicy.ACCEPT_ZERO) or 0,
        scale=_attention_scale(scaling, key_mla), rope_base=meta_float_opt(meta, ARCH, "rope.freq_base", 10000.0),
        rope_neox=False, rope_scaling=scaling, split=split)


def _rope_scaling(meta: Mapping) -> RopeScaling | None:
    """The file's RoPE scaling with DeepSeek-V2's YaRN magnitude: llama.cpp sets mscale to mscale_all_dim
    (the log multiplier) unless that is 1, so their ratio cancels."""
    scaling = rope_scaling(meta, ARCH)
    log_mul = _yarn_log_mul(meta)
    if scaling is None or not log_mul:
        return scaling
    return dataclasses.replace(scaling, mscale=log_mul if log_mul != 1.0 else 1.0, mscale_all_dims=log_mul)


def _yarn_log_mul(meta: Mapping) -> float:
    """DeepSeek's mscale_all_dim: the file stores it times 0.1 (llama.cpp's convert script), llama.cpp divides."""
    stored = meta_float_opt(meta, ARCH, "rope.scaling.yarn_log_multiplier", 0.0)
    return float(np.float32(stored) / np.float32(0.1))


def _attention_scale(scaling: RopeScaling | None, key_length: int) -> float:
    """llama.cpp's kq_scale for deepseek2: mscale^2 / sqrt(key length), where mscale is the RoPE magnitude (its
    attn_factor with YaRN's own factor undone) times 1 + 0.1 mscale_all_dim ln(factor), in float32."""
    f32 = np.float32
    mscale = f32(1)
    if scaling is not None and scaling.yarn:
        factor = f32(1) / (f32(1) / f32(scaling.factor))
        mscale = f32(scaling.magnitude()) * (f32(1) + f32(0.1) * f32(scaling.mscale_all_dims) * np.log(factor))
    return float(f32(1) * mscale * mscale / f32(math.sqrt(key_length)))
