"""Qwen3.5 (llama.cpp's qwen35): a hybrid of Gated DeltaNet layers (engine.models.delta_net: a recurrent state)
and, every `full_attention_interval`-th layer (or where `attention.recurrent_layers` says 0), gated
full-attention layers: q/k RMSNorm, partial NeoX RoPE over the first `rope.dimension_count` dims, the output
times the sigmoid of a gate that attn_q holds beside each head's query. The feed-forward (a gated MLP) has its
pre-norm named post_attention_norm.

llama.cpp rotates with its multi-axis RoPE (`rope.dimension_sections`, interleaved); a text position is the
same on the first three axes, so every pair the sections give one of them turns as NeoX's; a pair they give
the fourth (position 0 for text) would not turn, which no Qwen3.5 file does: such files are refused.
`block_count` counts the next-token-prediction (MTP) layer appended to the model (`nextn_predict_layers`): a
gated full-attention layer, not part of the forward; a draft source's model (engine.models.next_token) where the
file has its tensors (its head's norm, where it has none, the model's output norm, as llama.cpp's).
"""

from dataclasses import replace
from typing import Mapping

from engine.errors import ConfigError
from engine.gguf.meta import ZeroPolicy, meta_float_opt, meta_int, meta_int_opt, meta_value, per_layer
from engine.models.args import ModelArgs, llama_like
from engine.models.delta_net import DeltaNetArgs

ARCH = "qwen35"


def model_args(meta: Mapping, arch: str = ARCH) -> ModelArgs:
    n_all = meta_int(meta, arch, "block_count")
    n_nextn = meta_int_opt(meta, arch, "nextn_predict_layers", ZeroPolicy.ACCEPT_ZERO) or 0
    if n_nextn >= n_all:
        raise ConfigError(f"model metadata {arch}.nextn_predict_layers ({n_nextn}) leaves none of the "
                          f"{n_all} layers of {arch}.block_count to run")
    n_layers = n_all - n_nextn
    args = llama_like(meta, arch, qk_norm=True, output_gate=True)
    scale = meta_float_opt(meta, arch, "attention.scale", default=0.0)
    _check_text_rope(meta, arch, args.layers[0].mixer.rope_dims)
    mixer = _delta_net(meta, arch)
    recurrent = _recurrent_layers(meta, arch, n_all, n_layers)
    layers = []
    for i, layer in enumerate(args.layers):
        attention = replace(layer.mixer, scale=scale) if scale else layer.mixer
        layers.append(replace(layer, mixer=mixer if recurrent[i] else attention, ffn_norm="post_attention_norm.weight"))
    args.layers, args.next_token_layers = layers[:n_layers], layers[n_layers:]
    return args


def _delta_net(meta: Mapping, arch: str) -> DeltaNetArgs:
    n_v = meta_int(meta, arch, "ssm.time_step_rank")
    head = meta_int(meta, arch, "ssm.state_size")
    inner = meta_int(meta, arch, "ssm.inner_size")
    if inner != n_v * head:
        raise ConfigError(f"{arch}.ssm.inner_size {inner} must be ssm.time_step_rank {n_v} x ssm.state_size {head} "
                          "(value heads the size of key heads)")
    return DeltaNetArgs(n_k=meta_int(meta, arch, "ssm.group_count"), n_v=n_v, head=head,
                        d_conv=meta_int(meta, arch, "ssm.conv_kernel"))


def _recurrent_layers(meta: Mapping, arch: str, n_all: int, n_layers: int) -> list[bool]:
    """Which layers are DeltaNet layers: `attention.recurrent_layers` (a flag per layer), else all but every
    `full_attention_interval`-th (default 4), as llama.cpp's loader reads them; the MTP layers never."""
    key = f"{arch}.attention.recurrent_layers"
    if meta.get(key) is not None:
        return [bool(f) and i < n_layers for i, f in enumerate(per_layer(meta, key, n_all))]
    interval = meta_int_opt(meta, arch, "full_attention_interval") or 4
    return [i < n_layers and (i + 1) % interval != 0 for i in range(n_all)]


def _check_text_rope(meta: Mapping, arch: str, rope_dims: int) -> None:
    """Every rotated pair of the interleaved multi-axis RoPE takes one of the text position's three axes (see
    the module's docstring): ggml's sector rule for GGML_ROPE_TYPE_IMROPE."""
    key = f"{arch}.rope.dimension_sections"
    sections = meta_value(meta, key, "integers")
    if sections is None:
        return
    sections = [int(s) for s in sections]
    t, h, w = (sections + [0, 0, 0])[:3]
    total = sum(sections)
    if total <= 0:
        raise ConfigError(f"model metadata {key} {sections} gives no dimensions")

    def text_axis(sector: int) -> bool:
        return ((sector % 3 == 1 and sector < 3 * h) or (sector % 3 == 2 and sector < 3 * w)
                or (sector % 3 == 0 and sector < 3 * t))

    if not all(text_axis(pair % total) for pair in range(rope_dims // 2)):
        raise ConfigError(f"model metadata {key} {sections} rotates some of the {rope_dims} RoPE dims by a "
                          "fourth position axis (vision); not supported")
