"""The decoder-only transformer shared by the model families.

Families differ in a handful of switches (biases, q/k norms, post norms, the
activation, RoPE style and per-layer RoPE base / sliding window); each family
file reads its `ModelArgs` from GGUF metadata and builds this model from them.

A forward pass works on *segments*: (tokens, cache) pairs. The linear layers
run once over the rows of every segment together (one weight pass), while
attention runs per segment against its own cache. A plain forward is one
segment; a batched decode step is one single-token segment per conversation.

Two paths compute a forward, and `Transformer._forward` is the one place that
chooses between them:
- row-wise (decode, speculative verification, batched decode): every row gets
  exactly the bits it would get if it were fed alone, one token at a time, so a
  verified draft, a batched stream and a plain decode agree bit for bit. The
  whole stack of layers runs in one kernel call (kernels.cpu.decode) that still
  reads each weight once for all rows.
- prefill (prompts, teacher-forced scoring): `Block.__call__`, dequantized
  weight tiles and BLAS for many rows, much faster on long prompts, with numerics
  that depend on the batch shape (deterministic for a given shape).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numba import typed

from engine.errors import ConfigError, InvalidTokenId, KvCacheOverflow, KvCacheShapeMismatch
from engine.gguf.reader import GGUFFile
from engine.gguf.weights import LinearGroup, LinearWeight, load_vector
from engine.kv.cache import KvCache, KvDtype
from kernels.cpu import decode, ops, quant
from kernels.cpu.attention import attention_prefill


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

        self.kernel_layer = self._kernel_layer(args)

    def _kernel_layer(self, args: ModelArgs) -> decode.Layer | None:
        """This layer as the row-wise kernel reads it, or None when a weight has no native kernel (such
        a model feeds rows one at a time through the prefill path instead)."""
        attn, mlp = self.attn, self.mlp
        if not all(quant.has_native_kernel(p.qtype) for p in [*attn.qkv.parts, attn.wo, *mlp.gate_up.parts,
                                                                mlp.down]):
            return None

        def weights(parts):
            return (tuple(quant.kernel_weight(p.qtype, p.raw) for p in parts),
                    np.array([p.qtype for p in parts], np.int64))

        def vector(v):
            return np.zeros(0, np.float32) if v is None else v

        (qkv, qkv_types), (out, out_types) = weights(attn.qkv.parts), weights([attn.wo])
        (gate_up, gate_up_types), (down, down_types) = weights(mlp.gate_up.parts), weights([mlp.down])
        q_bias, k_bias, v_bias = attn.bias or (None,) * 3
        return decode.Layer(
            qkv=qkv, qkv_types=qkv_types, out=out, out_types=out_types, gate_up=gate_up,
            gate_up_types=gate_up_types, down=down, down_types=down_types,
            attn_norm=self.attn_norm, ffn_norm=self.ffn_norm, post_attn_norm=vector(self.post_attn_norm),
            post_ffn_norm=vector(self.post_ffn_norm), q_norm=vector(attn.q_norm), k_norm=vector(attn.k_norm),
            q_bias=vector(q_bias), k_bias=vector(k_bias), v_bias=vector(v_bias),
            n_head=attn.n_head, n_kv=attn.n_head_kv, head_dim=attn.head_dim, rope_dims=attn.rope_dims,
            rope_neox=bool(attn.rope_neox), rope_base=float(attn.rope_base),
            activation=ops.GELU if args.activation == "gelu" else ops.SILU, window=int(attn.window),
            eps=float(self.eps), attn_scale=float(attn.scale))

    def __call__(self, x: np.ndarray, segments) -> np.ndarray:
        """The prefill path: x [rows, n_embd] of every segment through this layer."""
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
# Row-wise calls take at most this many rows (verification needs far fewer): the logits of a call
# are [rows, vocab] float32, 67 MB at 64 rows for Gemma's 262k vocabulary.
ROWS_MAX = 64


class Transformer:
    """The model interface used by chat, speculation and cartridges."""

    def __init__(self, file: GGUFFile, args: ModelArgs):
        self.file = file
        self.args = args
        self.embed = LinearWeight.load(file, "token_embd.weight", args.vocab_size, args.n_embd)
        self.blocks = [Block(file, args, i) for i in range(args.n_layers)]
        self.norm = load_vector(file, "output_norm.weight", args.n_embd)
        # tied embeddings when the file has no separate output matrix
        self.output = (LinearWeight.load(file, "output.weight", args.vocab_size, args.n_embd)
                       if "output.weight" in file.tensors else self.embed)
        # the row-wise kernel's view of the layers; None when a weight type has no native kernel
        self._kernel_layers = None
        if all(b.kernel_layer is not None for b in self.blocks):
            self._kernel_layers = typed.List([b.kernel_layer for b in self.blocks])
        self._cache_views: "weakref.WeakKeyDictionary[KvCache, tuple]" = weakref.WeakKeyDictionary()

    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    @property
    def n_layers(self) -> int:
        return self.args.n_layers

    def new_cache(self, capacity: int, dtype: KvDtype | str = KvDtype.F16) -> KvCache:
        a = self.args
        return KvCache(a.n_head_kv, [a.head_dim] * a.n_layers, capacity, dtype)

    # -- the model interface ----------------------------------------------------------------------------

    def forward(self, tokens: Sequence[int], cache: KvCache) -> np.ndarray:
        """Feed tokens at position cache.len; return the last row's logits [vocab] (a prompt is prefilled;
        a single token is a decode step, row-wise)."""
        self._check_room(len(tokens), cache)
        for start in range(0, len(tokens) - UBATCH, UBATCH):
            self._forward([tokens[start : start + UBATCH]], [cache], all_rows=False)
        last = (max(len(tokens) - 1, 0) // UBATCH) * UBATCH
        return self._forward([tokens[last:]], [cache], all_rows=False)[0]

    def forward_all(self, tokens: Sequence[int], cache: KvCache) -> np.ndarray:
        """Feed tokens at position cache.len through the prefill path; return logits for every row
        [n, vocab]."""
        self._check_room(len(tokens), cache)
        return np.concatenate([self._forward([tokens[s : s + UBATCH]], [cache], all_rows=True)
                               for s in range(0, max(len(tokens), 1), UBATCH)])

    def forward_rows(self, tokens: Sequence[int], cache: KvCache) -> np.ndarray:
        """Feed tokens at position cache.len row-wise; return logits for every row [n, vocab], each row
        bitwise what feeding the tokens one at a time gives (the speculative verify forward)."""
        self._check_room(len(tokens), cache)
        return np.concatenate([self._forward([tokens[s : s + ROWS_MAX]], [cache], all_rows=True, row_wise=True)
                               for s in range(0, max(len(tokens), 1), ROWS_MAX)])

    def hidden_states(self, tokens: Sequence[int], cache: KvCache) -> np.ndarray:
        """Feed tokens at position cache.len through the prefill path; return every row's final hidden
        state, after the output norm and before the output matrix [n, n_embd] (what embeddings pool)."""
        self._check_room(len(tokens), cache)
        return np.concatenate([self._forward([tokens[s : s + UBATCH]], [cache], all_rows=True, head=False)
                               for s in range(0, max(len(tokens), 1), UBATCH)])

    def decode_batch(self, tokens: Sequence[int], caches: Sequence[KvCache]) -> np.ndarray:
        """One decode step for several conversations, one weight pass, row-wise: logits [len(caches), vocab]."""
        return self._forward([[t] for t in tokens], caches, all_rows=False, row_wise=True)

    # -- the two paths ----------------------------------------------------------------------------------

    def _forward(self, token_spans: Sequence[Sequence[int]], caches: Sequence[KvCache], *, all_rows: bool,
                 row_wise: bool | None = None, head: bool = True) -> np.ndarray:
        """Feed each span to its cache; the logits of every row (all_rows) or of each span's last row (the
        normed hidden states instead, without `head`). row_wise None: a single row is a decode step
        (row-wise), more are a prefill."""
        segments = self._segments(token_spans, caches)
        n = segments[-1][1]
        if row_wise is None:
            row_wise = n == 1
        x = self._embed(token_spans, n)
        if not row_wise:
            for block in self.blocks:
                x = block(x, segments)
        elif self._kernel_layers is not None:
            self._rows_kernel(x, segments)
        else:  # no native kernel for some weight: one row at a time through the prefill path
            x = np.concatenate([self._one_row(x[r : r + 1], cache) for r0, r1, cache in segments
                                for r in range(r0, r1)])
        if not row_wise or self._kernel_layers is not None:
            for r0, r1, cache in segments:
                cache.advance(r1 - r0)
        if not all_rows:
            x = x[[r1 - 1 for _, r1, _ in segments]]
        h = ops.rmsnorm(x, self.norm, self.args.norm_eps)
        if not head:
            return h
        return self.output.row_wise(h) if row_wise else self.output(h)

    def _one_row(self, row: np.ndarray, cache: KvCache) -> np.ndarray:
        """One row through the prefill path's layers, the cache advanced past it."""
        for block in self.blocks:
            row = block(row, [(0, 1, cache)])
        cache.advance(1)
        return row

    def _segments(self, token_spans, caches) -> list[tuple[int, int, KvCache]]:
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
        return segments

    def _embed(self, token_spans, n: int) -> np.ndarray:
        ids = np.fromiter((t for toks in token_spans for t in toks), dtype=np.int64, count=n)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0]
            raise InvalidTokenId(f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")
        x = self.embed.rows(ids)
        if self.args.embed_scale != 1.0:
            x *= np.float32(self.args.embed_scale)
        return x

    def _rows_kernel(self, x: np.ndarray, segments) -> None:
        """x [rows, n_embd] += every layer's outputs through the row-wise kernel; writes each row's K/V."""
        slots = np.empty(x.shape[0], np.int64)
        positions = np.empty(x.shape[0], np.int64)
        if len(segments) == 1:
            kcs, vcs = self._views(segments[0][2])
        else:
            kcs, vcs = typed.List(), typed.List()
            for _, _, cache in segments:
                k, v = self._views(cache)
                kcs.extend(k)
                vcs.extend(v)
        for slot, (r0, r1, cache) in enumerate(segments):
            slots[r0:r1] = slot
            positions[r0:r1] = np.arange(cache.len, cache.len + (r1 - r0))
        decode.forward_rows(x, self._kernel_layers, kcs, vcs, slots, positions, quant.threads())

    def _views(self, cache: KvCache) -> tuple:
        """The cache's per-layer K and V arrays as the kernel takes them (built once per cache)."""
        views = self._cache_views.get(cache)
        if views is None:
            views = self._cache_views[cache] = (typed.List(cache.k), typed.List(cache.v))
        return views

    def _check_cache(self, cache: KvCache) -> None:
        a = self.args
        if cache.kv_heads != tuple(a.n_head_kv) or cache.head_dims != (a.head_dim,) * a.n_layers:
            raise KvCacheShapeMismatch("the KV cache was made for a different model geometry")

    @staticmethod
    def _check_room(n: int, cache: KvCache) -> None:
        # checked up front so a long prompt fails before any of it is written
        if cache.len + n > cache.capacity:
            raise KvCacheOverflow(f"context full: {cache.len} + {n} tokens exceed the context of {cache.capacity}")


def default_attn_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
