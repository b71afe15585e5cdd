"""The attention mixer: grouped-query self-attention with RoPE over a KV cache, as the llama-like families
have it. Its variants are fields of its args: q/k/v biases (Qwen2), per-head q/k norms (Qwen3, Gemma 3), either
where the file has them (GLM-4.5), a sliding window and a RoPE base per layer (Gemma 3), NeoX or normal RoPE
pairs; an output bias, attention sinks and YaRN-scaled RoPE (gpt-oss), and an output gate (Qwen3.5: each head's
query rows followed by as many gate rows, its output times their sigmoid), which run on ops of their own (a
backend may lack them) and have no fused row-wise form. Gemma 4 adds V rows RMS-normed without a weight, V taken
from the K product where the file has no attn_v, angles divided by the file's rope_freqs (its proportional RoPE),
and layers that keep no KV rows of their own but attend to an earlier layer's (llama.cpp's shared KV layers).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from engine.gguf.reader import GGUFFile
from engine.gguf.weights import LinearGroup, LinearWeight, load_vector
from engine.models.layout import TensorSpec, bias, matrix, norm
from engine.models.parts import first_problem, positive, shown
from kernels.backend import (
    OP_ATTENTION, OP_ATTENTION_SHARED, OP_ATTENTION_SINKS, OP_GATED_SIGMOID, OP_LINEAR, OP_RMSNORM, OP_ROPE,
    OP_ROPE_SCALED, AttentionShape, AttentionSpec, Backend, RopeScaling, Segment,
)


ROPE_FREQS = "rope_freqs.weight"  # the model's one freq_factors tensor, [rope_dims / 2]
SHARED_KV = "shared"  # the MEMORY of a layer attending to an earlier layer's KV rows


@dataclass(frozen=True)
class AttentionArgs:
    VALUE_IS_KEY = False  # keys and values are cached apart

    n_head: int
    n_kv: int
    head_dim: int
    window: int  # sliding window; 0 = global attention
    scale: float
    rope_base: float
    rope_dims: int
    rope_neox: bool  # NeoX pairs dim i with i + rope_dims/2; normal pairs 2i with 2i+1
    qkv_bias: bool = False
    qk_norm: bool = False
    out_bias: bool = False
    sinks: bool = False  # a learned logit per head in the softmax's denominator (attn_sinks.weight)
    rope_scaling: RopeScaling | None = None
    # the q/k/v biases and q/k norms a file may leave out (llama.cpp's TENSOR_NOT_REQUIRED: GLM-4.5-Air has
    # no norms, GLM-4.5 has them): listed as optional, each used where the file has it
    optional_extras: bool = False
    output_gate: bool = False  # attn_q holds, per head, the query rows then the output gate's (Qwen3.5)
    value_norm: bool = False  # V rows RMS-normed per head, without a weight (Gemma 4)
    value_optional: bool = False  # a file without attn_v takes V from the K product (Gemma 4's k_eq_v layers)
    rope_freqs: bool = False  # each pair's angle divided by ROPE_FREQS's factor (Gemma 4's full layers)
    kv_from: int = -1  # >= 0: no KV rows of its own; it attends to those layer kv_from wrote (Gemma 4)

    @property
    def MEMORY(self) -> str:
        """What it keeps per conversation: KV rows (engine.kv.cache), or none: another layer's (SHARED_KV)."""
        return "kv" if self.kv_from < 0 else SHARED_KV

    @property
    def OPS(self) -> tuple[str, ...]:
        """The backend ops the part runs on."""
        return (OP_LINEAR, OP_RMSNORM, OP_ROPE, OP_ATTENTION, *((OP_ATTENTION_SINKS,) if self.sinks else ()),
                *((OP_ROPE_SCALED,) if self.rope_scaling or self.rope_freqs else ()),
                *((OP_GATED_SIGMOID,) if self.output_gate else ()),
                *((OP_ATTENTION_SHARED,) if self.kv_from >= 0 else ()))

    def tensors(self, p: str, n_embd: int) -> list[TensorSpec]:
        nh, nkv, hd = self.n_head, self.n_kv, self.head_dim
        widths = {"q": nh * hd * (2 if self.output_gate else 1), "k": nkv * hd, "v": nkv * hd}
        if self.kv_from >= 0:  # no K or V rows of its own
            del widths["k"], widths["v"]
        tensors = [matrix(f"{p}attn_{t}.weight", n, n_embd, t != "v" or not self.value_optional)
                   for t, n in widths.items()]
        tensors.append(matrix(p + "attn_output.weight", n_embd, nh * hd))
        extras = []
        if self.qkv_bias:
            extras += [bias(f"{p}attn_{t}.bias", n) for t, n in widths.items()]
        if self.qk_norm:
            extras += [norm(p + f"attn_{t}_norm.weight", hd) for t in widths if t in "qk"]
        tensors += [replace(t, required=False) for t in extras] if self.optional_extras else extras
        if self.out_bias:
            tensors.append(bias(p + "attn_output.bias", n_embd))
        if self.sinks:
            tensors.append(bias(p + "attn_sinks.weight", nh))
        return tensors

    def kv_geometry(self) -> tuple[int, int]:
        """What this layer keeps per position in the KV cache: (kv heads, head size)."""
        return self.n_kv, self.head_dim

    def build(self, file: GGUFFile, p: str, layer: int, n_embd: int, eps: float, backend: Backend) -> "Attention":
        return Attention(self, file, p, layer, n_embd, eps, backend)

    @staticmethod
    def check_layers(arch: str, layers: Sequence["AttentionArgs"]) -> str | None:
        """The first kernel precondition these layers' attention breaks (naming its metadata key), or None."""
        n_head = layers[0].n_head
        kv = [a.n_kv for a in layers]
        head_dim, rope_dims = layers[0].head_dim, layers[0].rope_dims
        return first_problem([
            (n_head >= 1, f"{arch}.attention.head_count is {n_head}; it must be positive"),
            (all(1 <= k <= n_head and n_head % k == 0 for k in kv),
             f"{arch}.attention.head_count_kv {shown(kv)} must divide the {n_head} attention heads"),
            (head_dim >= 1, f"the head size ({arch}.attention.key_length) is {head_dim}; it must be positive"),
            (2 <= rope_dims <= head_dim and rope_dims % 2 == 0,
             f"{arch}.rope.dimension_count is {rope_dims}; it must be even and at most the head size {head_dim}"),
            (all(a.window >= 0 for a in layers),
             f"{arch}.attention.sliding_window {shown([a.window for a in layers])} must not be negative"),
            (all(positive(a.rope_base) for a in layers),
             f"{arch}.rope.freq_base {shown([a.rope_base for a in layers])} must be positive"),
            (all(positive(a.scale) for a in layers), f"attention scale {layers[0].scale} must be positive"),
            (all(a.rope_scaling is None or positive(a.rope_scaling.factor) for a in layers),
             f"{arch}.rope.scaling.factor must be positive"),
            (all(a.rope_scaling is None or not a.rope_scaling.yarn or a.rope_scaling.n_ctx_orig >= 1 for a in layers),
             f"{arch}.rope.scaling.original_context_length must be positive"),
        ])


class Attention:
    def __init__(self, args: AttentionArgs, file: GGUFFile, p: str, layer: int, n_embd: int, eps: float,
                 backend: Backend):
        hd, nh, nkv = args.head_dim, args.n_head, args.n_kv
        self.backend = backend
        self.args = args
        sinks = backend.upload_vector(load_vector(file, p + "attn_sinks.weight", nh)) if args.sinks else None
        self.shape = AttentionShape(n_head=nh, n_kv=nkv, head_dim=hd, window=int(args.window),
                                    scale=float(args.scale), sinks=sinks)

        def wanted(name: str) -> bool:  # what the args list, where an optional tensor is in the file
            return not args.optional_extras or name in file.tensors

        def bias_of(t):
            return f"{p}attn_{t}.bias" if args.qkv_bias and wanted(f"{p}attn_{t}.bias") else None

        if args.output_gate:  # the query and the gate apart, the gate computed with k and v
            query, gate = LinearWeight.load_interleaved(file, p + "attn_q.weight", 2, hd, 2 * nh * hd, n_embd, backend)
            extra = [gate]
        else:
            query, extra = LinearWeight.load(file, p + "attn_q.weight", nh * hd, n_embd, backend, bias_of("q")), []
        own_kv = args.kv_from < 0
        # V from the K product where the file has no attn_v (value_optional)
        self.value_from_key = own_kv and args.value_optional and p + "attn_v.weight" not in file.tensors
        kv = [LinearWeight.load(file, f"{p}attn_{t}.weight", nkv * hd, n_embd, backend, bias_of(t))
              for t in ("k", "v")[: 2 - self.value_from_key]] if own_kv else []
        self.qkv = LinearGroup([query, *kv, *extra])
        self.q_norm = self.k_norm = None
        if args.qk_norm and wanted(p + "attn_q_norm.weight"):
            self.q_norm = backend.upload_vector(load_vector(file, p + "attn_q_norm.weight", hd))
            if own_kv:
                self.k_norm = backend.upload_vector(load_vector(file, p + "attn_k_norm.weight", hd))
        self.v_norm = backend.upload_vector(np.ones(hd, np.float32)) if args.value_norm else None  # x 1: exact
        self.rope_scaling = args.rope_scaling
        if args.rope_freqs:
            factors = tuple(float(f) for f in load_vector(file, ROPE_FREQS, hd // 2)[: args.rope_dims // 2])
            self.rope_scaling = replace(args.rope_scaling or RopeScaling(factor=1.0, yarn=False), freq_factors=factors)
        self.wo = LinearWeight.load(file, p + "attn_output.weight", n_embd, nh * hd, backend,
                                    p + "attn_output.bias" if args.out_bias else None)
        self.layer = layer
        self.eps = eps

    def __call__(self, h, segments: Sequence[Segment], positions: np.ndarray, row_wise: bool):
        """h [rows, n_embd]; segments: the rows of each cache, at positions[row]."""
        be, a = self.backend, self.args
        q, *rest = self.qkv(h, row_wise)
        n_kv = 0 if a.kv_from >= 0 else 2 - self.value_from_key
        kv, gate = rest[:n_kv], rest[n_kv:]
        k, v = (kv[0], kv[-1]) if kv else (None, None)
        if self.q_norm is not None:
            q = be.rmsnorm(q, self.q_norm, self.eps)
        if self.v_norm is not None and v is not None:
            v = be.rmsnorm(v, self.v_norm, self.eps)
        rope = (a.head_dim, a.rope_dims, float(a.rope_base), bool(a.rope_neox), self.rope_scaling)
        be.rope(q, positions, *rope)
        if k is not None:
            if self.k_norm is not None:
                k = be.rmsnorm(k, self.k_norm, self.eps)
            be.rope(k, positions, *rope)
        out = be.attention(q, k, v, segments, self.layer, self.shape, row_wise)
        if gate:
            out = be.gated("sigmoid", gate[0], out)
        return self.wo(out, row_wise)

    def spec(self) -> AttentionSpec | None:
        """This mixer as a backend's fused row-wise stack reads it (the output gate and Gemma 4's variants have
        no fused form)."""
        a = self.args
        if a.output_gate or a.value_norm or a.kv_from >= 0 or self.value_from_key:
            return None
        return AttentionSpec(qkv=tuple(w.handle for w in self.qkv.parts), out=self.wo.handle, q_norm=self.q_norm,
                             k_norm=self.k_norm, shape=self.shape, rope_dims=a.rope_dims,
                             rope_neox=bool(a.rope_neox), rope_base=float(a.rope_base), rope_scaling=self.rope_scaling)
