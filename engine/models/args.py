"""What a family's GGUF metadata says about its network (ModelArgs: the model's sizes and each layer's
parts), and the reading of the metadata keys every llama-like family shares."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from engine.errors import ConfigError
import numpy as np

from engine.gguf.meta import meta_float, meta_float_opt, meta_int, meta_int_opt, meta_value, per_layer, per_layer_int
from engine.models.attention import SHARED_KV, AttentionArgs
from engine.models.block import LayerArgs
from engine.models.feed_forward import GatedMlpArgs
from engine.models.layout import TensorSpec, layer_prefix, matrix, norm
from engine.models.next_token import next_token_tensors
from kernels.backend import OP_EMBED, OP_LINEAR, OP_RMSNORM, OP_TAKE_ROWS, RopeScaling


@dataclass
class ModelArgs:
    arch: str
    n_embd: int
    vocab_size: int
    norm_eps: float
    context_length: int
    layers: list[LayerArgs] = field(default_factory=list)
    embed_scale: float = 1.0
    # next-token-prediction layers the file appends after `layers` (GLM-4.5's MTP; engine.models.next_token):
    # not part of the forward, a draft source's model
    next_token_layers: list[LayerArgs] = field(default_factory=list)
    # a part giving each layer an input of its own from the token ids and the embedded rows (Gemma 4's per-layer
    # embeddings: LayerInputsArgs in engine.models.gemma4), or None
    layer_inputs: Any = None
    logit_softcap: float = 0.0  # > 0: logits = cap * tanh(logits / cap) (Gemma's final_logit_softcapping)
    extra_tensors: tuple[TensorSpec, ...] = ()  # model-wide tensors a layer part reads (Gemma 4's rope_freqs)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def ops(self) -> set[str]:
        """The backend ops the model runs on: the embedding, the layers', the output norm and head."""
        return {OP_EMBED, OP_RMSNORM, OP_LINEAR, OP_TAKE_ROWS}.union(*(layer.ops() for layer in self.layers))

    def tensors(self) -> list[TensorSpec]:
        """Every tensor of the model (engine.models.layout): the embedding, the untied output matrix (a file
        may leave it out), the output norm, then each layer's."""
        e = self.n_embd
        tensors = [matrix("token_embd.weight", self.vocab_size, e),
                   matrix("output.weight", self.vocab_size, e, required=False), norm("output_norm.weight", e),
                   *self.extra_tensors, *(self.layer_inputs.tensors(e) if self.layer_inputs else ())]
        for i, layer in enumerate(self.layers):
            tensors += layer.tensors(layer_prefix(i), e)
        for i, layer in enumerate(self.next_token_layers, self.n_layers):
            tensors += [replace(t, required=False) for t in next_token_tensors(layer, i, e, self.vocab_size)]
        return tensors

    def _keeping(self, memory: str) -> list[LayerArgs]:
        return [layer for layer in self.layers if layer.mixer.MEMORY == memory]

    def kv_geometry(self) -> tuple[list[int], list[int]]:
        """The KV cache's rows of each layer that keeps them: (kv heads per layer, head size per layer)."""
        heads, dims = zip(*(layer.mixer.kv_geometry() for layer in self._keeping("kv")))
        return list(heads), list(dims)

    def kv_value_is_key(self) -> list[bool]:
        """Per KV cache layer, whether its cached V rows are its K rows (KvCache's value_is_key)."""
        return [layer.mixer.VALUE_IS_KEY for layer in self._keeping("kv")]

    def state_shapes(self) -> list:
        """The recurrent state of each layer that keeps one (a hybrid's DeltaNet layers); [] for the others."""
        return [layer.mixer.state_shape() for layer in self._keeping("state")]

    def memory_slots(self) -> list[int]:
        """Each layer's index among the layers keeping its kind of memory (its KV cache layer, or state layer);
        a layer attending to another's KV rows (SHARED_KV) gets that layer's."""
        seen: dict[str, int] = {}
        slots = []
        for layer in self.layers:
            kind = layer.mixer.MEMORY
            if kind == SHARED_KV:
                slots.append(slots[layer.mixer.kv_from])
                continue
            slots.append(seen.get(kind, 0))
            seen[kind] = slots[-1] + 1
        return slots


def vocab_size(meta: Mapping, arch: str) -> int:
    n = meta_int_opt(meta, arch, "vocab_size")
    if n is None:
        tokens = meta_value(meta, "tokenizer.ggml.tokens", "strings")
        if not tokens:
            raise ConfigError(f"model metadata has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
        n = len(tokens)
    return n


def sliding_layers(meta: Mapping, arch: str, n_layers: int, default_pattern: int) -> list[bool]:
    """Which layers see a sliding window, as llama.cpp's load_swa_pattern reads
    `attention.sliding_window_pattern`: one flag per layer (nonzero: sliding), or a period p (default
    `default_pattern`) after which every p-th layer is global (layer i slides when i % p < p - 1)."""
    key = f"{arch}.attention.sliding_window_pattern"
    if isinstance(meta.get(key), (list, np.ndarray)):
        flags = per_layer(meta, key, n_layers)
        if not all(isinstance(f, (bool, int)) for f in flags):
            raise ConfigError(f"model metadata {key} must be a period or one flag per layer")
        return [bool(f) for f in flags]
    pattern = meta_int_opt(meta, arch, "attention.sliding_window_pattern") or default_pattern
    return [i % pattern < pattern - 1 for i in range(n_layers)]


_ROPE_SCALING_TYPES = ("none", "linear", "yarn")


def rope_scaling(meta: Mapping, arch: str) -> RopeScaling | None:
    """The RoPE scaling of the "<arch>.rope.scaling.*" keys, as llama.cpp's common loader reads them (type
    default "linear"; factor 0 or missing: none; YaRN's betas at their defaults: only some families read
    rope.scaling.yarn_*), or None."""
    kind = meta_value(meta, f"{arch}.rope.scaling.type", "string") or "linear"
    if kind not in _ROPE_SCALING_TYPES:
        raise ConfigError(f"model metadata {arch}.rope.scaling.type is {kind!r}; supported: "
                          f"{', '.join(_ROPE_SCALING_TYPES)}")
    factor = meta_float_opt(meta, arch, "rope.scaling.factor", default=0.0)
    if kind == "none" or factor in (0.0, 1.0) and kind != "yarn":
        return None
    n_ctx_orig = (meta_int_opt(meta, arch, "rope.scaling.original_context_length")
                  or meta_int_opt(meta, arch, "context_length") or 0)
    return RopeScaling(factor=factor or 1.0, yarn=kind == "yarn", n_ctx_orig=n_ctx_orig,
                       attn_factor=meta_float_opt(meta, arch, "rope.scaling.attn_factor", default=1.0))


def default_attn_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def llama_like(meta: Mapping, arch: str, *, activation: str = "silu", qkv_bias: bool = False,
               qk_norm: bool = False, post_norms: bool = False, rope_neox: bool = True,
               window: Sequence[int] | None = None, rope_base: Sequence[float] | None = None,
               embed_scale: float = 1.0, **attention) -> ModelArgs:
    """The args of a llama-like family from the standard "<arch>.*" keys: every layer attention and a gated
    MLP; the keywords are what a family sets (window and rope_base: one per layer, default global
    attention and `rope.freq_base`; `attention`: more AttentionArgs fields, the same in every layer)."""
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
    base = meta_float_opt(meta, arch, "rope.freq_base", default=10000.0)
    rope_dims = meta_int_opt(meta, arch, "rope.dimension_count") or head_dim
    n_ff = meta_int(meta, arch, "feed_forward_length")
    windows = list(window) if window is not None else [0] * n_layers
    bases = list(rope_base) if rope_base is not None else [base] * n_layers

    def layer(i: int) -> LayerArgs:
        mixer = AttentionArgs(n_head=n_head, n_kv=n_head_kv[i], head_dim=head_dim, window=windows[i],
                              scale=default_attn_scale(head_dim), rope_base=bases[i], rope_dims=rope_dims,
                              rope_neox=rope_neox, qkv_bias=qkv_bias, qk_norm=qk_norm, **attention)
        return LayerArgs(mixer, GatedMlpArgs(n_ff, activation), post_norms)

    return ModelArgs(arch=arch, n_embd=n_embd, vocab_size=vocab_size(meta, arch),
                     norm_eps=meta_float(meta, arch, "attention.layer_norm_rms_epsilon"),
                     context_length=meta_int_opt(meta, arch, "context_length") or 4096,
                     layers=[layer(i) for i in range(n_layers)], embed_scale=embed_scale)
