"""Gemma 4 (llama.cpp's `gemma4`): Gemma 3's sandwich of norms and GeGLU, with more to each layer.

As llama.cpp's graph (src/models/gemma4.cpp) reads the file:
- Sliding-window and full layers (`attention.sliding_window_pattern`, one flag per layer) with their own head
  sizes (`key_length_swa` / `key_length`), KV head counts (`head_count_kv` per layer), RoPE dims and bases
  (`rope.dimension_count_swa`, `rope.freq_base_swa`, default 10000); the full layers' RoPE is "proportional":
  the file's `rope_freqs` divide most pairs' angles by 1e30, so they turn by ~0. Attention scale 1 (the q/k
  norms do its work); V rows RMS-normed without a weight; no attn_v: V is the K product.
- The last `attention.shared_kv_layers` layers keep no KV rows: each attends to those of the last layer of
  its kind before them (layer n - 2 for a sliding one, n - 1 for a full one, n the first without KV).
- Per-layer embeddings (`embedding_length_per_layer_input` > 0, the E2B/E4B models): a second embedding
  table gives each token a row per layer, mixed with a projection of the embedded token (LayerInputs); each
  layer ends by adding proj(gelu(inp_gate(x)) * its row), normed.
- A layer output scale (`layer_output_scale`), and the logits soft-capped (`final_logit_softcapping`).
- The MoE variant (26B-A4B): each layer runs the dense MLP and, beside it, experts routed from
  rms_norm(x) / sqrt(n_embd) * ffn_gate_inp.scale (softmax, top-k normalized), GeGLU experts whose outputs
  are scaled per expert (ffn_down_exps.scale); the two normed apart and added.
The norm weights are used as stored (Gemma 4's converter adds no +1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from engine.errors import ConfigError
from engine.gguf.meta import (
    ZeroPolicy, meta_float, meta_float_opt, meta_int, meta_int_opt, per_layer_int,
)
from engine.gguf.reader import GGUFFile
from engine.gguf.weights import LinearWeight, load_vector
from engine.models.args import ModelArgs, sliding_layers, vocab_size
from engine.models.attention import ROPE_FREQS, AttentionArgs
from engine.models.block import Block, LayerArgs
from engine.models.experts import MoeArgs
from engine.models.feed_forward import GatedMlpArgs
from engine.models.layout import NORM, TensorSpec, layer_prefix, matrix, norm
from kernels.backend import GEGLU, OP_GATED, OP_MOE_FFN, OP_SCALE, Backend, Gating

ARCH = "gemma4"
SWA_ROPE_BASE = 10000.0  # llama.cpp's rope_freq_base_train_swa when the file has none


def model_args(meta: Mapping) -> ModelArgs:
    def key(suffix):
        return f"{ARCH}.{suffix}"

    n_layers = meta_int(meta, ARCH, "block_count")
    n_embd = meta_int(meta, ARCH, "embedding_length")
    n_head = per_layer_int(meta, key("attention.head_count"), n_layers)
    n_kv = per_layer_int(meta, key("attention.head_count_kv"), n_layers, default=n_head[0])
    if key("attention.sliding_window_pattern") not in meta:
        raise ConfigError(f"model metadata {key('attention.sliding_window_pattern')} is missing")
    sliding = sliding_layers(meta, ARCH, n_layers, 1)
    head_full = meta_int_opt(meta, ARCH, "attention.key_length") or n_embd // max(n_head[0], 1)
    head_swa = meta_int_opt(meta, ARCH, "attention.key_length_swa") or head_full
    for suffix, head in (("", head_full), ("_swa", head_swa)):
        value = meta_int_opt(meta, ARCH, f"attention.value_length{suffix}") or head
        if value != head:
            raise ConfigError(f"{key('attention.value_length' + suffix)} {value} differs from the key length {head}")
    rot_full = meta_int_opt(meta, ARCH, "rope.dimension_count") or head_full
    rot_swa = meta_int_opt(meta, ARCH, "rope.dimension_count_swa") or rot_full
    base_full = meta_float_opt(meta, ARCH, "rope.freq_base", default=10000.0)
    base_swa = meta_float_opt(meta, ARCH, "rope.freq_base_swa", default=SWA_ROPE_BASE)
    window = meta_int(meta, ARCH, "attention.sliding_window")
    kv_from = _shared_kv_sources(meta, n_layers, sliding)
    n_ff = per_layer_int(meta, key("feed_forward_length"), n_layers)
    experts = _experts(meta, n_layers)
    n_per_layer = meta_int_opt(meta, ARCH, "embedding_length_per_layer_input", ZeroPolicy.ACCEPT_ZERO) or 0

    def layer(i: int) -> Gemma4LayerArgs:
        swa = sliding[i]
        mixer = AttentionArgs(n_head=n_head[i], n_kv=n_kv[i], head_dim=head_swa if swa else head_full,
                              window=window if swa else 0, scale=1.0, rope_base=base_swa if swa else base_full,
                              rope_dims=rot_swa if swa else rot_full, rope_neox=True, qk_norm=True, value_norm=True,
                              value_optional=True, rope_freqs=not swa, kv_from=kv_from[i])
        return Gemma4LayerArgs(mixer, GatedMlpArgs(n_ff[i], "gelu"), post_norms=True, experts=experts[i],
                               per_layer_input=n_per_layer)

    vocab = vocab_size(meta, ARCH)
    return ModelArgs(arch=ARCH, n_embd=n_embd, vocab_size=vocab,
                     norm_eps=meta_float(meta, ARCH, "attention.layer_norm_rms_epsilon"),
                     context_length=meta_int_opt(meta, ARCH, "context_length") or 4096,
                     layers=[layer(i) for i in range(n_layers)], embed_scale=math.sqrt(n_embd),
                     layer_inputs=LayerInputsArgs(n_per_layer, n_layers, vocab) if n_per_layer else None,
                     logit_softcap=meta_float_opt(meta, ARCH, "final_logit_softcapping", default=0.0),
                     extra_tensors=(TensorSpec(ROPE_FREQS, (head_full // 2,), NORM),) if not all(sliding) else ())


def _shared_kv_sources(meta: Mapping, n_layers: int, sliding: list[bool]) -> list[int]:
    """Each layer's kv_from: -1 for the first n_layers - shared_kv_layers, which keep KV rows; after them, the
    last layer of the same kind that keeps them, as llama.cpp's layer reuse callback picks (the file's last two
    such layers are a sliding one, then a full one)."""
    shared = meta_int_opt(meta, ARCH, "attention.shared_kv_layers", ZeroPolicy.ACCEPT_ZERO) or 0
    first = n_layers - shared
    if shared and (first < 2 or not sliding[first - 2] or sliding[first - 1]):
        raise ConfigError(f"{ARCH}.attention.shared_kv_layers is {shared}: the layers before the shared ones must "
                          f"end with a sliding-window layer and then a full one")
    return [-1 if i < first else first - (2 if sliding[i] else 1) for i in range(n_layers)]


def _experts(meta: Mapping, n_layers: int) -> list[MoeArgs | None]:
    """Each layer's experts (the MoE variant has them in every layer), or None."""
    n_expert = meta_int_opt(meta, ARCH, "expert_count", ZeroPolicy.ACCEPT_ZERO) or 0
    if not n_expert:
        return [None] * n_layers
    n_used = meta_int(meta, ARCH, "expert_used_count")
    n_ff = per_layer_int(meta, f"{ARCH}.expert_feed_forward_length", n_layers)
    layers = [MoeArgs(n_expert=n_expert, n_used=n_used, n_ff=f, gating=Gating.SOFTMAX, normalize=True,
                      activation=GEGLU) for f in n_ff]
    problem = MoeArgs.check_layers(ARCH, layers)
    if problem:
        raise ConfigError(problem)
    return layers


@dataclass(frozen=True)
class Gemma4LayerArgs(LayerArgs):
    experts: MoeArgs | None = None  # routed beside the dense MLP (the MoE variant)
    per_layer_input: int = 0  # the width of the layer's input from LayerInputs (0: none)

    def ops(self) -> set[str]:
        return super().ops() | {OP_SCALE, OP_GATED, *((OP_MOE_FFN,) if self.experts else ())}

    def tensors(self, p: str, n_embd: int) -> list[TensorSpec]:
        tensors = super().tensors(p, n_embd)
        if self.experts is not None:
            e = self.experts.n_expert
            tensors += [*self.experts.tensors(p, n_embd), norm(p + "ffn_gate_inp.scale", n_embd),
                        TensorSpec(p + "ffn_down_exps.scale", (e,), NORM, required=False),
                        *(norm(p + name, n_embd) for name in _EXPERT_NORMS)]
        if self.per_layer_input:
            n = self.per_layer_input
            tensors += [matrix(p + "inp_gate.weight", n, n_embd), matrix(p + "proj.weight", n_embd, n),
                        norm(p + "post_norm.weight", n_embd)]
        return tensors + [TensorSpec(p + _OUT_SCALE, (1,), NORM, required=False)]

    def build(self, file: GGUFFile, layer: int, n_embd: int, eps: float, backend: Backend,
              cache_layer: int | None = None) -> "Gemma4Block":
        return Gemma4Block(file, self, layer, n_embd, eps, backend, cache_layer)


_EXPERT_NORMS = ("pre_ffw_norm_2.weight", "post_ffw_norm_1.weight", "post_ffw_norm_2.weight")
_OUT_SCALE = "layer_output_scale.weight"


class Gemma4Block(Block):
    """A Gemma 4 layer: Block's attention and dense MLP with their norms, then the experts beside the MLP, the
    per-layer input and the output scale where the layer has them. No fused row-wise form (spec None)."""

    def __init__(self, file: GGUFFile, args: Gemma4LayerArgs, layer: int, n_embd: int, eps: float,
                 backend: Backend, cache_layer: int | None = None):
        super().__init__(file, args, layer, n_embd, eps, backend, cache_layer)
        p = layer_prefix(layer)

        def vector(name):
            return backend.upload_vector(load_vector(file, p + name, n_embd))

        self.moe = None
        if args.experts is not None:  # the experts' part (its router run on the input below), and their norms
            self.moe = args.experts.build(file, p, layer, n_embd, backend)
            # rms_norm(x) / sqrt(n_embd) * scale, in one norm: the scale's vector times 1 / sqrt(n_embd)
            self.router_norm = backend.upload_vector(load_vector(file, p + "ffn_gate_inp.scale", n_embd)
                                                     * (1.0 / math.sqrt(n_embd)))
            self.pre_norm_2, self.post_norm_1, self.post_norm_2 = (vector(name) for name in _EXPERT_NORMS)
        self.per_layer = None
        if args.per_layer_input:
            n = args.per_layer_input
            self.per_layer = (LinearWeight.load(file, p + "inp_gate.weight", n, n_embd, backend),
                              LinearWeight.load(file, p + "proj.weight", n_embd, n, backend),
                              vector("post_norm.weight"))
        self.out_scale = float(load_vector(file, p + _OUT_SCALE, 1)[0]) if p + _OUT_SCALE in file.tensors else None

    def spec(self):
        return None

    def moe_parts(self) -> list:
        return [self.moe] if self.moe is not None else []

    def __call__(self, x, segments, positions, row_wise: bool, layer_input=None):
        be, eps = self.backend, self.eps
        a = self.mixer(be.rmsnorm(x, self.attn_norm, eps), segments, positions, row_wise)
        x = be.add(x, be.rmsnorm(a, self.post_attn_norm, eps))
        f = self.feed_forward(be.rmsnorm(x, self.ffn_norm, eps), row_wise)
        if self.moe is not None:  # the dense MLP and the experts, each normed after, added
            logits = self.moe.router(be.rmsnorm(x, self.router_norm, eps), row_wise)
            routed = be.moe_ffn(self.moe.experts, be.rmsnorm(x, self.pre_norm_2, eps), logits, row_wise)
            f = be.add(be.rmsnorm(f, self.post_norm_1, eps), be.rmsnorm(routed, self.post_norm_2, eps))
        x = be.add(x, be.rmsnorm(f, self.post_ffn_norm, eps))
        if self.per_layer is not None:
            gate, proj, post_norm = self.per_layer
            mixed = be.gated("gelu", gate(x, row_wise), layer_input)
            x = be.add(x, be.rmsnorm(proj(mixed, row_wise), post_norm, eps))
        if self.out_scale is not None:
            x = be.scale(x, self.out_scale)
        return x


_PER_LAYER_TABLE, _PER_LAYER_PROJ, _PER_LAYER_NORM = ("per_layer_token_embd.weight", "per_layer_model_proj.weight",
                                                      "per_layer_proj_norm.weight")


@dataclass(frozen=True)
class LayerInputsArgs:
    """Gemma 4's per-layer embeddings: each layer's input of `width` per token (ModelArgs.layer_inputs)."""

    width: int
    n_layers: int
    vocab_size: int

    def tensors(self, n_embd: int) -> list[TensorSpec]:
        total = self.width * self.n_layers
        return [matrix(_PER_LAYER_TABLE, self.vocab_size, total), matrix(_PER_LAYER_PROJ, total, n_embd),
                norm(_PER_LAYER_NORM, self.width)]

    def build(self, file: GGUFFile, model: ModelArgs, backend: Backend) -> "LayerInputs":
        return LayerInputs(self, file, model, backend)


class LayerInputs:
    """(rms_norm(proj(x) / sqrt(n_embd)) + table[token] * sqrt(width)) / sqrt(2), cut into each layer's width,
    as llama.cpp's project_per_layer_inputs (x: the embedded rows, scaled)."""

    def __init__(self, args: LayerInputsArgs, file: GGUFFile, model: ModelArgs, backend: Backend):
        total = args.width * args.n_layers
        self.args = args
        self.backend = backend
        self.eps = model.norm_eps
        self.n_embd = model.n_embd
        self.table = LinearWeight.load(file, _PER_LAYER_TABLE, args.vocab_size, total, backend)
        self.proj = LinearWeight.load(file, _PER_LAYER_PROJ, total, model.n_embd, backend)
        self.norm = backend.upload_vector(load_vector(file, _PER_LAYER_NORM, args.width))

    def __call__(self, ids, x, row_wise: bool) -> list:
        be, w = self.backend, self.args.width
        rows = self.table.rows(ids, math.sqrt(w))
        projected = be.rmsnorm(be.scale(self.proj(x, row_wise), 1.0 / math.sqrt(self.n_embd)), self.norm, self.eps)
        inputs = be.scale(be.add(projected, rows), 1.0 / math.sqrt(2.0))
        # each layer's columns: a view (Gemma 4 runs on the CPU's ops only: OP_SCALE)
        return [inputs[:, i * w: (i + 1) * w] for i in range(self.args.n_layers)]
