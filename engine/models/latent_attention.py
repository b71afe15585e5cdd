"""The latent attention mixer (DeepSeek-V2/V3's MLA, llama.cpp's deepseek2: attn_k_b/attn_v_b, or an older file's
attn_kv_b split into them at load):
each head's query from x (directly, attn_q, or through a low rank, attn_q_a -> RMSNorm -> attn_q_b), and one
compressed row per position (attn_kv_a_mqa: a latent of kv_lora_rank values and a RoPE'd key part shared by
every head). The cache keeps that row -- the normed latent and the rotated part, one "head" of rank + rope
values -- not expanded keys and values, and attention runs in the absorbed form for every path (the backend's
`latent_attention` op).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.gguf.reader import GGUFFile
from engine.gguf.weights import LinearGroup, LinearWeight, load_heads, load_unsplit_kv_b, load_vector
from engine.models.layout import TensorSpec, heads, matrix, norm
from engine.models.parts import first_problem, positive
from kernels.backend import (OP_LATENT_ATTENTION, OP_LINEAR, OP_RMSNORM, AttentionShape, Backend,
                             LatentAttentionSpec, RopeScaling, Segment)


@dataclass(frozen=True)
class LatentAttentionArgs:
    OPS = (OP_LINEAR, OP_RMSNORM, OP_LATENT_ATTENTION)  # the backend ops the part runs on
    MEMORY = "kv"  # what it keeps per conversation: KV rows (engine.kv.cache)
    VALUE_IS_KEY = True  # the one cached row is read as both key and value
    n_head: int
    rank: int  # kv_lora_rank: the cached latent's width
    nope: int  # each head's query/key dims without RoPE
    rope_dims: int  # with RoPE
    v_dim: int  # each head's value width
    q_rank: int  # q_lora_rank: 0 for a query straight from x (attn_q)
    scale: float  # the attention logits' scale
    rope_base: float
    rope_neox: bool = False
    rope_scaling: RopeScaling | None = None
    split: bool = True  # attn_k_b and attn_v_b; False: an older file's attn_kv_b, split at load

    def tensors(self, p: str, n_embd: int) -> list[TensorSpec]:
        nh, rank, rd = self.n_head, self.rank, self.rope_dims
        q_width = nh * (self.nope + rd)
        if self.q_rank:
            query = [matrix(p + "attn_q_a.weight", self.q_rank, n_embd), norm(p + "attn_q_a_norm.weight", self.q_rank),
                     matrix(p + "attn_q_b.weight", q_width, self.q_rank)]
        else:
            query = [matrix(p + "attn_q.weight", q_width, n_embd)]
        if self.split:
            up = [heads(p + "attn_k_b.weight", nh, rank, self.nope), heads(p + "attn_v_b.weight", nh, self.v_dim, rank)]
        else:
            up = [matrix(p + "attn_kv_b.weight", nh * (self.nope + self.v_dim), rank)]
        return query + [matrix(p + "attn_kv_a_mqa.weight", rank + rd, n_embd), norm(p + "attn_kv_a_norm.weight", rank),
                        *up, matrix(p + "attn_output.weight", n_embd, nh * self.v_dim)]

    def kv_geometry(self) -> tuple[int, int]:
        """One cached row per position: the latent and the RoPE'd key part."""
        return 1, self.rank + self.rope_dims

    def build(self, file: GGUFFile, p: str, layer: int, n_embd: int, eps: float, backend: Backend) -> "LatentAttention":
        return LatentAttention(self, file, p, layer, n_embd, eps, backend)

    @staticmethod
    def check_layers(arch: str, layers: Sequence["LatentAttentionArgs"]) -> str | None:
        a = layers[0]
        return first_problem([
            (a.n_head >= 1, f"{arch}.attention.head_count is {a.n_head}; it must be positive"),
            (a.rank >= 1, f"{arch}.attention.kv_lora_rank is {a.rank}; it must be positive"),
            (a.q_rank >= 0, f"{arch}.attention.q_lora_rank is {a.q_rank}; it must not be negative"),
            (a.nope >= 1, f"{arch}.attention.key_length_mla must exceed {arch}.rope.dimension_count ({a.rope_dims})"),
            (a.rope_dims >= 2 and a.rope_dims % 2 == 0,
             f"{arch}.rope.dimension_count is {a.rope_dims}; it must be even and positive"),
            (a.v_dim >= 1, f"{arch}.attention.value_length_mla is {a.v_dim}; it must be positive"),
            (all(positive(x.rope_base) for x in layers), f"{arch}.rope.freq_base must be positive"),
            (all(positive(x.scale) for x in layers), f"attention scale {a.scale} must be positive"),
            (a.rope_scaling is None or positive(a.rope_scaling.factor), f"{arch}.rope.scaling.factor must be positive"),
        ])


class LatentAttention:
    def __init__(self, args: LatentAttentionArgs, file: GGUFFile, p: str, layer: int, n_embd: int, eps: float,
                 backend: Backend):
        nh, rank, rd = args.n_head, args.rank, args.rope_dims
        self.backend, self.layer, self.eps = backend, layer, eps
        q_width = nh * (args.nope + rd)
        kv_a = LinearWeight.load(file, p + "attn_kv_a_mqa.weight", rank + rd, n_embd, backend)
        self.q_a_norm = self.q_b = None
        if args.q_rank:  # the query's low rank and the compressed row share the input: one pass
            self.inputs = LinearGroup([LinearWeight.load(file, p + "attn_q_a.weight", args.q_rank, n_embd, backend),
                                       kv_a])
            self.q_a_norm = backend.upload_vector(load_vector(file, p + "attn_q_a_norm.weight", args.q_rank))
            self.q_b = LinearWeight.load(file, p + "attn_q_b.weight", q_width, args.q_rank, backend)
        else:
            self.inputs = LinearGroup([LinearWeight.load(file, p + "attn_q.weight", q_width, n_embd, backend), kv_a])
        if args.split:
            k_b = load_heads(file, p + "attn_k_b.weight", nh, rank, args.nope, backend)
            v_b = load_heads(file, p + "attn_v_b.weight", nh, args.v_dim, rank, backend)
        else:
            k_b, v_b = load_unsplit_kv_b(file, p + "attn_kv_b.weight", nh, args.nope, args.v_dim, rank, backend)
        self.latent = LatentAttentionSpec(
            n_head=nh, rank=rank, nope=args.nope, rope_dims=rd, v_dim=args.v_dim,
            kv_norm=backend.upload_vector(load_vector(file, p + "attn_kv_a_norm.weight", rank)),
            k_b=tuple(k_b), v_b=tuple(v_b),
            shape=AttentionShape(n_head=nh, n_kv=1, head_dim=rank + rd, window=0, scale=float(args.scale)),
            rope_base=float(args.rope_base), rope_neox=bool(args.rope_neox), eps=float(eps),
            rope_scaling=args.rope_scaling)
        self.wo = LinearWeight.load(file, p + "attn_output.weight", n_embd, nh * args.v_dim, backend)

    def __call__(self, h, segments: Sequence[Segment], positions: np.ndarray, row_wise: bool):
        be = self.backend
        q, kv = self.inputs(h, row_wise)
        if self.q_b is not None:
            q = self.q_b(be.rmsnorm(q, self.q_a_norm, self.eps), row_wise)
        out = be.latent_attention(self.latent, q, kv, segments, positions, self.layer, row_wise)
        return self.wo(out, row_wise)

    def spec(self) -> None:
        """No fused row-wise form yet: the layer runs through the composed ops."""
        return None
