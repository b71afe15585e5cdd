"""GLM-4.5 and GLM-4.5-Air (llama.cpp's glm4moe): attention with q/k/v biases, partial NeoX RoPE (the first
`rope.dimension_count` dims of each head) and q/k norms where the file has them (GLM-4.5, not Air); a dense
gated MLP in the first `leading_dense_block_count` layers and experts after them with a shared expert,
sigmoid gating (`expert_gating_func` 2, the default) and the selection bias exp_probs_b, the weights
normalized and scaled as the metadata says. The feed-forward's pre-norm is named post_attention_norm.

`block_count` counts the next-token-prediction (MTP, "nextn") layers appended to the model
(`nextn_predict_layers`): they are not part of its forward; the first is a draft source's model
(engine.models.next_token) where the file has its tensors.
Multimodal files (GLM-4.5V: `rope.dimension_sections`, multi-axis RoPE) are refused.
"""

from dataclasses import replace
from typing import Mapping

from engine.errors import ConfigError
from engine.gguf.meta import ZeroPolicy, meta_int, meta_int_opt
from engine.models.args import ModelArgs, llama_like
from engine.models.experts import routed_experts
from kernels.backend import Gating

ARCH = "glm4moe"


def model_args(meta: Mapping) -> ModelArgs:
    n_all = meta_int(meta, ARCH, "block_count")
    n_nextn = meta_int_opt(meta, ARCH, "nextn_predict_layers", ZeroPolicy.ACCEPT_ZERO) or 0
    if n_nextn >= n_all:
        raise ConfigError(f"model metadata {ARCH}.nextn_predict_layers ({n_nextn}) leaves none of the "
                          f"{n_all} layers of {ARCH}.block_count to run")
    if meta.get(f"{ARCH}.rope.dimension_sections") is not None:
        raise ConfigError(f"{ARCH}: multi-axis RoPE ({ARCH}.rope.dimension_sections, a multimodal GLM) is not "
                          "supported")
    args = llama_like(meta, ARCH, qkv_bias=True, qk_norm=True, optional_extras=True)
    n_dense = meta_int_opt(meta, ARCH, "leading_dense_block_count", ZeroPolicy.ACCEPT_ZERO) or 0
    experts = routed_experts(meta, ARCH, unset_gating=Gating.SIGMOID)
    layers = [replace(layer, feed_forward=layer.feed_forward if i < n_dense else experts,
                      ffn_norm="post_attention_norm.weight") for i, layer in enumerate(args.layers)]
    args.layers, args.next_token_layers = layers[: n_all - n_nextn], layers[n_all - n_nextn:]
    return args
