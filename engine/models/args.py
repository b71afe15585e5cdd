"""Reading the metadata keys that every llama-like family shares."""

from __future__ import annotations

from typing import Mapping

from engine.errors import ConfigError
from engine.gguf.meta import meta_float, meta_float_opt, meta_int, meta_int_opt, meta_value, per_layer_int
from engine.models.transformer import ModelArgs, default_attn_scale


def vocab_size(meta: Mapping, arch: str) -> int:
    n = meta_int_opt(meta, arch, "vocab_size")
    if n is None:
        tokens = meta_value(meta, "tokenizer.ggml.tokens", "strings")
        if not tokens:
            raise ConfigError(f"model metadata has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
        n = len(tokens)
    return n


def common_args(meta: Mapping, arch: str, **family) -> ModelArgs:
    """ModelArgs from the standard "<arch>.*" keys; `family` sets or overrides fields."""
    n_layers = meta_int(meta, arch, "block_count")
    n_embd = meta_int(meta, arch, "embedding_length")
    n_head = meta_int(meta, arch, "attention.head_count")
    n_head_kv = per_layer_int(meta, f"{arch}.attention.head_count_kv", n_layers, default=n_head)
    if n_embd % n_head and meta_int_opt(meta, arch, "attention.key_length") is None:
        raise ConfigError(f"{arch}.embedding_length {n_embd} is not a multiple of the {n_head} heads")
    head_dim = meta_int_opt(meta, arch, "attention.key_length") or n_embd // n_head
    value_dim = meta_int_opt(meta, arch, "attention.value_length") or head_dim
    if value_dim != head_dim:
        raise ConfigError(f"{arch}: key length {head_dim} differs from value length {value_dim}; not supported")
    rope_base = meta_float_opt(meta, arch, "rope.freq_base", default=10000.0)
    fields = dict(
        arch=arch,
        n_layers=n_layers,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_ff=meta_int(meta, arch, "feed_forward_length"),
        vocab_size=vocab_size(meta, arch),
        norm_eps=meta_float(meta, arch, "attention.layer_norm_rms_epsilon"),
        rope_base=[rope_base] * n_layers,
        rope_dims=meta_int_opt(meta, arch, "rope.dimension_count") or head_dim,
        rope_neox=True,
        context_length=meta_int_opt(meta, arch, "context_length") or 4096,
        window=[0] * n_layers,
        attn_scale=default_attn_scale(head_dim),
    )
    fields.update(family)
    return ModelArgs(**fields)
