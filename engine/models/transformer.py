"""The decoder-only transformer shared by the model families.

Families differ in a handful of switches (biases, q/k norms, post norms, the
activation, RoPE style and per-layer RoPE base / sliding window); each family
file reads its `ModelArgs` from GGUF metadata and builds this model from them.

A forward pass works on *segments*: (tokens, cache) pairs. The linear layers
run once over the rows of every segment together (one weight pass), while
attention runs per segment against its own cache. A plain forward is one
segment; a batched decode step is one single-token segment per conversation.

Every op runs on the model's backend (kernels.backend: the CPU's Numba kernels,
or a device), which holds the weights and the KV caches; this file names none.

Two paths compute a forward, and `Transformer._forward` is the one place that
chooses between them:
- row-wise (decode, speculative verification, batched decode): every row gets
  exactly the bits it would get if it were fed alone, one token at a time, so a
  verified draft, a batched stream and a plain decode agree bit for bit. A
  backend with a fused row stack runs the whole stack of layers in one call
  (the CPU's reads each weight once for all rows); otherwise `Block.__call__`
  composes the row-wise ops.
- prefill (prompts, teacher-forced scoring): `Block.__call__`, on the CPU
  dequantized weight tiles and BLAS for many rows, much faster on long prompts,
  with numerics that depend on the batch shape (deterministic for a given shape).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.errors import ConfigError, InvalidTokenId, KvCacheOverflow, KvCacheShapeMismatch
from engine.gguf.reader import GGUFFile
from engine.gguf.weights import LinearGroup, LinearWeight, load_vector
from engine.kv.cache import KvCache, KvDtype
from kernels.backend import AttentionShape, Backend, LayerSpec, Segment, cpu_backend


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
    def __init__(self, file: GGUFFile, args: ModelArgs, layer: int, backend: Backend):
        p = f"blk.{layer}."
        hd, nh, nkv = args.head_dim, args.n_head, args.n_head_kv[layer]
        if nkv <= 0 or nh % nkv:
            raise ConfigError(f"layer {layer}: {nh} attention heads are not a multiple of {nkv} kv heads")
        self.backend = backend
        self.shape = AttentionShape(n_head=nh, n_kv=nkv, head_dim=hd, window=int(args.window[layer]),
                                    scale=float(args.attn_scale))

        def bias(name):
            return p + name if args.qkv_bias else None

        self.qkv = LinearGroup([
            LinearWeight.load(file, p + "attn_q.weight", nh * hd, args.n_embd, backend, bias("attn_q.bias")),
            LinearWeight.load(file, p + "attn_k.weight", nkv * hd, args.n_embd, backend, bias("attn_k.bias")),
            LinearWeight.load(file, p + "attn_v.weight", nkv * hd, args.n_embd, backend, bias("attn_v.bias")),
        ])
        self.q_norm = self.k_norm = None
        if args.qk_norm:
            self.q_norm = backend.upload_vector(load_vector(file, p + "attn_q_norm.weight", hd))
            self.k_norm = backend.upload_vector(load_vector(file, p + "attn_k_norm.weight", hd))
        self.wo = LinearWeight.load(file, p + "attn_output.weight", args.n_embd, nh * hd, backend)
        self.layer = layer
        self.eps = args.norm_eps
        self.rope_base = float(args.rope_base[layer])
        self.rope_dims = args.rope_dims
        self.rope_neox = bool(args.rope_neox)

    def __call__(self, h, segments: Sequence[Segment], positions: np.ndarray, row_wise: bool):
        """h [rows, n_embd]; segments: the rows of each cache, at positions[row]."""
        be, hd = self.backend, self.shape.head_dim
        q, k, v = self.qkv(h, row_wise)
        if self.q_norm is not None:
            q = be.rmsnorm(q, self.q_norm, self.eps)
            k = be.rmsnorm(k, self.k_norm, self.eps)
        be.rope(q, positions, hd, self.rope_dims, self.rope_base, self.rope_neox)
        be.rope(k, positions, hd, self.rope_dims, self.rope_base, self.rope_neox)
        out = be.attention(q, k, v, segments, self.layer, self.shape, row_wise)
        return self.wo(out, row_wise)


class MLP:
    def __init__(self, file: GGUFFile, args: ModelArgs, layer: int, backend: Backend):
        p = f"blk.{layer}."
        self.backend = backend
        self.gate_up = LinearGroup([
            LinearWeight.load(file, p + "ffn_gate.weight", args.n_ff, args.n_embd, backend),
            LinearWeight.load(file, p + "ffn_up.weight", args.n_ff, args.n_embd, backend),
        ])
        self.down = LinearWeight.load(file, p + "ffn_down.weight", args.n_embd, args.n_ff, backend)
        self.activation = "gelu" if args.activation == "gelu" else "silu"

    def __call__(self, h, row_wise: bool):
        gate, up = self.gate_up(h, row_wise)
        return self.down(self.backend.gated(self.activation, gate, up), row_wise)


class Block:
    def __init__(self, file: GGUFFile, args: ModelArgs, layer: int, backend: Backend):
        p = f"blk.{layer}."
        e = args.n_embd
        self.backend = backend
        self.eps = args.norm_eps

        def vector(name):
            return backend.upload_vector(load_vector(file, p + name, e))

        self.attn_norm = vector("attn_norm.weight")
        self.attn = Attention(file, args, layer, backend)
        self.ffn_norm = vector("ffn_norm.weight")
        self.mlp = MLP(file, args, layer, backend)
        self.post_attn_norm = self.post_ffn_norm = None
        if args.post_norms:
            self.post_attn_norm = vector("post_attention_norm.weight")
            self.post_ffn_norm = vector("post_ffw_norm.weight")

    def spec(self) -> LayerSpec:
        """This layer as a backend's fused row stack reads it."""
        attn, mlp = self.attn, self.mlp
        return LayerSpec(
            qkv=tuple(p.handle for p in attn.qkv.parts), out=attn.wo.handle,
            gate_up=tuple(p.handle for p in mlp.gate_up.parts), down=mlp.down.handle,
            attn_norm=self.attn_norm, ffn_norm=self.ffn_norm, post_attn_norm=self.post_attn_norm,
            post_ffn_norm=self.post_ffn_norm, q_norm=attn.q_norm, k_norm=attn.k_norm, attention=attn.shape,
            rope_dims=attn.rope_dims, rope_neox=attn.rope_neox, rope_base=attn.rope_base,
            activation=mlp.activation, eps=float(self.eps))

    def __call__(self, x, segments: Sequence[Segment], positions: np.ndarray, row_wise: bool):
        """x [rows, n_embd] of every segment through this layer, its ops row-wise or prefill."""
        be = self.backend
        a = self.attn(be.rmsnorm(x, self.attn_norm, self.eps), segments, positions, row_wise)
        if self.post_attn_norm is not None:
            a = be.rmsnorm(a, self.post_attn_norm, self.eps)
        x = be.add(x, a)
        f = self.mlp(be.rmsnorm(x, self.ffn_norm, self.eps), row_wise)
        if self.post_ffn_norm is not None:
            f = be.rmsnorm(f, self.post_ffn_norm, self.eps)
        return be.add(x, f)


# Prompts are fed in slices of at most this many tokens, so activations stay bounded
# (a 4k-token prompt would otherwise hold several [4096, n_ff] f32 buffers at once).
UBATCH = 512
# Row-wise calls take at most this many rows (verification needs far fewer): the logits of a call
# are [rows, vocab] float32, 67 MB at 64 rows for Gemma's 262k vocabulary.
ROWS_MAX = 64


class Transformer:
    """The model interface used by chat, speculation and cartridges."""

    def __init__(self, file: GGUFFile, args: ModelArgs, backend: Backend | None = None):
        self.file = file
        self.args = args
        self.backend = be = backend or cpu_backend()
        self.embed = LinearWeight.load(file, "token_embd.weight", args.vocab_size, args.n_embd, be)
        self.blocks = [Block(file, args, i, be) for i in range(args.n_layers)]
        self.norm = be.upload_vector(load_vector(file, "output_norm.weight", args.n_embd))
        # tied embeddings when the file has no separate output matrix
        self.output = (LinearWeight.load(file, "output.weight", args.vocab_size, args.n_embd, be)
                       if "output.weight" in file.tensors else self.embed)
        # the backend's fused row-wise stack of the layers; None: the row-wise ops are composed
        self._row_stack = be.row_stack([b.spec() for b in self.blocks])

    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    @property
    def n_layers(self) -> int:
        return self.args.n_layers

    def new_cache(self, capacity: int, dtype: KvDtype | str = KvDtype.F16) -> KvCache:
        a = self.args
        return KvCache(a.n_head_kv, [a.head_dim] * a.n_layers, capacity, dtype, self.backend)

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

    def rows_ready(self, cache: KvCache, wait: bool = False) -> bool:
        """Whether forward_rows of several rows over `cache` runs at its own speed yet: its kernels compile
        after the one-row decode's, in the background, which asking starts (wait: and waits for); until
        then it gives the same bits, more slowly."""
        return self._row_stack is None or self._row_stack.rows_ready(cache.store, wait)

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
        n = segments[-1].row_end
        if row_wise is None:
            row_wise = n == 1
        be = self.backend
        x = self._embed(token_spans, n)
        if row_wise and self._row_stack is not None:
            self._row_stack.forward(x, segments)
        else:
            positions = np.concatenate([np.arange(s.pos0, s.pos0 + s.row_end - s.row_start) for s in segments])
            for block in self.blocks:
                x = block(x, segments, positions, row_wise)
        for cache, s in zip(caches, segments):
            cache.advance(s.row_end - s.row_start)
        if not all_rows:
            x = be.take_rows(x, [s.row_end - 1 for s in segments])
        h = be.rmsnorm(x, self.norm, self.args.norm_eps)
        if not head:
            return be.to_host(h)
        return be.to_host(self.output(h, row_wise))

    def _segments(self, token_spans, caches) -> list[Segment]:
        if len(token_spans) != len(caches) or len({id(c) for c in caches}) != len(caches):
            raise ValueError("each segment needs its own cache")
        segments, r = [], 0
        for toks, cache in zip(token_spans, caches):
            self._check_cache(cache)
            if len(toks) == 0:
                raise ValueError("empty token span")
            self._check_room(len(toks), cache)
            segments.append(Segment(r, r + len(toks), cache.store, cache.len))
            r += len(toks)
        return segments

    def _embed(self, token_spans, n: int) -> np.ndarray:
        ids = np.fromiter((t for toks in token_spans for t in toks), dtype=np.int64, count=n)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0]
            raise InvalidTokenId(f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")
        return self.embed.rows(ids, self.args.embed_scale)

    def _check_cache(self, cache: KvCache) -> None:
        a = self.args
        if cache.kv_heads != tuple(a.n_head_kv) or cache.head_dims != (a.head_dim,) * a.n_layers:
            raise KvCacheShapeMismatch("the KV cache was made for a different model geometry")
        if cache.backend is not self.backend:
            raise KvCacheShapeMismatch(f"the KV cache lives on the {cache.backend.name} backend; this model runs "
                                       f"on the {self.backend.name} backend")

    @staticmethod
    def _check_room(n: int, cache: KvCache) -> None:
        # checked up front so a long prompt fails before any of it is written
        if cache.len + n > cache.capacity:
            raise KvCacheOverflow(f"context full: {cache.len} + {n} tokens exceed the context of {cache.capacity}")


def default_attn_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
