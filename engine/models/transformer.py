"""The decoder-only transformer shared by the model families.

Families differ in a handful of switches (biases, q/k norms, post norms, the
activation, RoPE style and per-layer RoPE base / sliding window); each family
file reads its `ModelArgs` from GGUF metadata and builds this model from them.

A forward pass works on *segments*: (tokens, cache) pairs. The linear layers
run once over the rows of every segment together (one weight pass), while
attention runs per segment against its own cache. A plain forward is one
segment; a batched decode step is one single-token segment per conversation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.errors import ConfigError, KvCacheOverflow, KvCacheShapeMismatch
from engine.gguf.reader import GGUFFile
from engine.gguf.weights import LinearGroup, LinearWeight, load_vector
from engine.kv.cache import KvCache, KvDtype
from kernels.cpu import decode, ops, quant
from kernels.cpu.attention import attention_decode, attention_prefill


@dataclass
class ModelArgs:
    """What a family's GGUF metadata says about the network."""

    arch: str
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: list[int]
    head_dim: int
    n_ff: int
    vocab_size: int
    norm_eps: float
    rope_base: list[float]  # per layer
    rope_dims: int
    rope_neox: bool
    context_length: int
    window: list[int]  # per layer; 0 = global attention
    attn_scale: float
    activation: str = "silu"  # or "gelu"
    qkv_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False  # Gemma's norms after attention and FFN
    embed_scale: float = 1.0


class Attention:
    def __init__(self, file: GGUFFile, args: ModelArgs, layer: int):
        p = f"blk.{layer}."
        hd, nh, nkv = args.head_dim, args.n_head, args.n_head_kv[layer]
        if nkv <= 0 or nh % nkv:
            raise ConfigError(f"layer {layer}: {nh} attention heads are not a multiple of {nkv} kv heads")
        self.n_head, self.n_head_kv, self.head_dim = nh, nkv, hd
        self.qkv = LinearGroup([
            LinearWeight.load(file, p + "attn_q.weight", nh * hd, args.n_embd),
            LinearWeight.load(file, p + "attn_k.weight", nkv * hd, args.n_embd),
            LinearWeight.load(file, p + "attn_v.weight", nkv * hd, args.n_embd),
        ])
        self.bias = None
        if args.qkv_bias:
            self.bias = (load_vector(file, p + "attn_q.bias", nh * hd),
                         load_vector(file, p + "attn_k.bias", nkv * hd),
                         load_vector(file, p + "attn_v.bias", nkv * hd))
        self.q_norm = self.k_norm = None
        if args.qk_norm:
            self.q_norm = load_vector(file, p + "attn_q_norm.weight", hd)
            self.k_norm = load_vector(file, p + "attn_k_norm.weight", hd)
        self.wo = LinearWeight.load(file, p + "attn_output.weight", args.n_embd, nh * hd)
        self.layer = layer
        self.eps = args.norm_eps
        self.window = args.window[layer]
        self.rope_base = args.rope_base[layer]
        self.rope_dims = args.rope_dims
        self.rope_neox = args.rope_neox
        self.scale = args.attn_scale

    def __call__(self, h: np.ndarray, segments: Sequence[tuple[int, int, KvCache]]) -> np.ndarray:
        """h [rows, n_embd]; segments: (row_start, row_end, cache) with the rows' positions
        continuing at cache.len."""
        n = h.shape[0]
        q, k, v = self.qkv(h)
        if self.bias is not None:
            q += self.bias[0]
            k += self.bias[1]
            v += self.bias[2]
        q = q.reshape(n, self.n_head, self.head_dim)
        k = k.reshape(n, self.n_head_kv, self.head_dim)
        v = v.reshape(n, self.n_head_kv, self.head_dim)
        if self.q_norm is not None:
            q = ops.rmsnorm(q, self.q_norm, self.eps)
            k = ops.rmsnorm(k, self.k_norm, self.eps)
        out = np.empty_like(q)
        for r0, r1, cache in segments:
            pos0 = cache.len
            positions = np.arange(pos0, pos0 + (r1 - r0))
            qs, ks = q[r0:r1], k[r0:r1]
            ops.rope(qs, positions, self.rope_dims, self.rope_base, self.rope_neox)
            ops.rope(ks, positions, self.rope_dims, self.rope_base, self.rope_neox)
            cache.append_layer(self.layer, ks, v[r0:r1])
            n_keys = pos0 + (r1 - r0)
            if r1 - r0 == 1 and cache.dtype is KvDtype.F16:
                attention_decode(qs[0], cache.k[self.layer], cache.v[self.layer], n_keys,
                                 self.window, self.scale, out[r0])
            elif r1 - r0 == 1:
                attention_decode(qs[0], cache.keys_f32(self.layer, n_keys), cache.values_f32(self.layer, n_keys),
                                 n_keys, self.window, self.scale, out[r0])
            else:
                out[r0:r1] = attention_prefill(qs, cache.keys_f32(self.layer, n_keys),
                                               cache.values_f32(self.layer, n_keys), pos0, self.window, self.scale)
        return self.wo(out.reshape(n, -1))


class MLP:
    def __init__(self, file: GGUFFile, args: ModelArgs, layer: int):
        p = f"blk.{layer}."
        self.gate_up = LinearGroup([
            LinearWeight.load(file, p + "ffn_gate.weight", args.n_ff, args.n_embd),
            LinearWeight.load(file, p + "ffn_up.weight", args.n_ff, args.n_embd),
        ])
        self.down = LinearWeight.load(file, p + "ffn_down.weight", args.n_embd, args.n_ff)
        self.act = ops.gelu_mul if args.activation == "gelu" else ops.silu_mul

    def __call__(self, h: np.ndarray) -> np.ndarray:
        gate, up = self.gate_up(h)
        return self.down(self.act(gate, up))


class Block:
    def __init__(self, file: GGUFFile, args: ModelArgs, layer: int):
        p = f"blk.{layer}."
        e = args.n_embd
        self.eps = args.norm_eps
        self.attn_norm = load_vector(file, p + "attn_norm.weight", e)
        self.attn = Attention(file, args, layer)
        self.ffn_norm = load_vector(file, p + "ffn_norm.weight", e)
        self.mlp = MLP(file, args, layer)
        self.post_attn_norm = self.post_ffn_norm = None
        if args.post_norms:
            self.post_attn_norm = load_vector(file, p + "post_attention_norm.weight", e)
            self.post_ffn_norm = load_vector(file, p + "post_ffw_norm.weight", e)

        self.fused = self._fused_layer(args)

    def _fused_layer(self, args: ModelArgs) -> tuple | None:
        """The arguments of kernels.cpu.decode.decode_layer for this layer, or None when a
        weight has no native kernel (those layers decode through the general path)."""
        attn, mlp = self.attn, self.mlp
        parts = [*attn.qkv.parts, attn.wo, *mlp.gate_up.parts, mlp.down]
        if not all(quant.has_native_kernel(p.qtype) for p in parts):
            return None
        none = np.zeros(0, np.float32)
        vecs = (self.attn_norm, self.ffn_norm, self.post_attn_norm, self.post_ffn_norm, attn.q_norm, attn.k_norm,
                *(attn.bias or (None,) * 3))
        geo = np.array([attn.n_head, attn.n_head_kv, attn.head_dim, attn.rope_dims, attn.rope_neox,
                        ops.GELU if args.activation == "gelu" else ops.SILU, attn.window], np.int64)
        return (tuple(quant.kernel_weight(p.qtype, p.raw) for p in parts), np.array([p.qtype for p in parts]),
                tuple(none if v is None else v for v in vecs), geo, self.eps, attn.rope_base, attn.scale)

    def decode_one(self, x: np.ndarray, cache: KvCache, threads: int) -> None:
        """x [n_embd] += this layer's output for one token at cache.len (f16 cache, fused kernel)."""
        layer = self.attn.layer
        decode.decode_layer(x, *self.fused, cache.k[layer], cache.v[layer], cache.len, threads)

    def __call__(self, x: np.ndarray, segments) -> np.ndarray:
        a = self.attn(ops.rmsnorm(x, self.attn_norm, self.eps), segments)
        if self.post_attn_norm is not None:
            a = ops.rmsnorm(a, self.post_attn_norm, self.eps)
        x = x + a
        f = self.mlp(ops.rmsnorm(x, self.ffn_norm, self.eps))
        if self.post_ffn_norm is not None:
            f = ops.rmsnorm(f, self.post_ffn_norm, self.eps)
        return x + f


# Prompts are fed in slices of at most this many tokens, so activations stay bounded
# (a 4k-token prompt would otherwise hold several [4096, n_ff] f32 buffers at once).
UBATCH = 512


class Transformer:
    """The model interface used by chat, speculation and cartridges."""

    def __init__(self, file: GGUFFile, args: ModelArgs):
        self.file = file
        self.args = args
        self.embed = LinearWeight.load(file, "token_embd.weight", args.vocab_size, args.n_embd)
        self.blocks = [Block(file, args, i) for i in range(args.n_layers)]
        self.norm = load_vector(file, "output_norm.weight", args.n_embd)
        self._fused = all(b.fused is not None for b in self.blocks)  # single-token decode in one call per layer
        # tied embeddings when the file has no separate output matrix
        self.output = (LinearWeight.load(file, "output.weight", args.vocab_size, args.n_embd)
                       if "output.weight" in file.tensors else self.embed)

    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    @property
    def n_layers(self) -> int:
        return self.args.n_layers

    def new_cache(self, capacity: int, dtype: KvDtype | str = KvDtype.F16) -> KvCache:
        a = self.args
        return KvCache(a.n_head_kv, [a.head_dim] * a.n_layers, capacity, dtype)

    def _check_cache(self, cache: KvCache) -> None:
        a = self.args
        if cache.kv_heads != tuple(a.n_head_kv) or cache.head_dims != (a.head_dim,) * a.n_layers:
            raise KvCacheShapeMismatch("the KV cache was made for a different model geometry")

    def _run(self, token_spans: Sequence[Sequence[int]], caches: Sequence[KvCache], all_rows: bool) -> np.ndarray:
        if len(token_spans) != len(caches) or len({id(c) for c in caches}) != len(caches):
            raise ValueError("each segment needs its own cache")
        segments, r = [], 0
        for toks, cache in zip(token_spans, caches):
            self._check_cache(cache)
            if len(toks) == 0:
                raise ValueError("empty token span")
            self._check_room(len(toks), cache)
            segments.append((r, r + len(toks), cache))
            r += len(toks)
        ids = np.fromiter((t for toks in token_spans for t in toks), dtype=np.int64, count=r)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0]
            raise ValueError(f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")
        x = self.embed.rows(ids)
        if self.args.embed_scale != 1.0:
            x *= np.float32(self.args.embed_scale)
        if self._fused and r == 1 and caches[0].dtype is KvDtype.F16:
            threads = quant.threads()
            for block in self.blocks:
                block.decode_one(x[0], caches[0], threads)
        else:
            for block in self.blocks:
                x = block(x, segments)
        for r0, r1, cache in segments:
            cache.advance(r1 - r0)
        if not all_rows:
            x = x[[r1 - 1 for _, r1, _ in segments]]
        return self.output(ops.rmsnorm(x, self.norm, self.args.norm_eps))

    def forward(self, tokens: Sequence[int], cache: KvCache) -> np.ndarray:
        """Feed tokens at position cache.len; return the last row's logits [vocab]."""
        self._check_room(len(tokens), cache)
        for start in range(0, len(tokens) - UBATCH, UBATCH):
            self._run([tokens[start : start + UBATCH]], [cache], all_rows=False)
        last = (max(len(tokens) - 1, 0) // UBATCH) * UBATCH
        return self._run([tokens[last:]], [cache], all_rows=False)[0]

    def forward_all(self, tokens: Sequence[int], cache: KvCache) -> np.ndarray:
        """Feed tokens at position cache.len; return logits for every row [n, vocab]."""
        self._check_room(len(tokens), cache)
        return np.concatenate([self._run([tokens[s : s + UBATCH]], [cache], all_rows=True)
                               for s in range(0, max(len(tokens), 1), UBATCH)])

    @staticmethod
    def _check_room(n: int, cache: KvCache) -> None:
        # checked up front so a long prompt fails before any of it is written
        if cache.len + n > cache.capacity:
            raise KvCacheOverflow(f"context full: {cache.len} + {n} tokens exceed the context of {cache.capacity}")

    def decode_batch(self, tokens: Sequence[int], caches: Sequence[KvCache]) -> np.ndarray:
        """One decode step for several conversations, one weight pass: logits [len(caches), vocab]."""
        return self._run([[t] for t in tokens], caches, all_rows=False)


def default_attn_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
