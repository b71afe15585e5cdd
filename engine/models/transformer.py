"""The decoder-only transformer shared by the model families.

Each family file reads its `ModelArgs` from GGUF metadata: the model's sizes and each layer's parts
(engine.models.parts: a mixer and a feed-forward part, composed by engine.models.block's Block); this
model builds its layers from them and runs them.

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
  backend with a fused row stack runs each run of layers it takes in one call
  (the CPU's reads each weight once for all rows); `Block.__call__` composes
  the row-wise ops for the layers no stack takes.
- prefill (prompts, teacher-forced scoring): `Block.__call__`, on the CPU
  dequantized weight tiles and BLAS for many rows, much faster on long prompts,
  with numerics that depend on the batch shape (deterministic for a given shape).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.errors import ConfigError, InvalidTokenId, KvCacheOverflow, KvCacheShapeMismatch, UnsupportedOnBackend
from engine.gguf.reader import GGUFFile
from engine.gguf.weights import LinearWeight, load_vector
from engine.kv.cache import KvCache, KvDtype
from engine.kv.recurrent import HybridCache
from engine.models.args import ModelArgs
from engine.models.block import Block
from engine.models.expert_store import ExpertStore, StreamOptions
from engine.models.model import UBATCH
from engine.models.next_token import load_predictor
from kernels.backend import OP_MOE_STREAMED, Backend, RowStack, Segment, cpu_backend


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
        self.blocks = [layer.build(file, i, args.n_embd, args.norm_eps, be, slot)
                       for i, (layer, slot) in enumerate(zip(args.layers, args.memory_slots()))]
        self.layer_inputs = args.layer_inputs.build(file, args, be) if args.layer_inputs else None
        self.norm = be.upload_vector(load_vector(file, "output_norm.weight", args.n_embd))
        # tied embeddings when the file has no separate output matrix
        self.output = (LinearWeight.load(file, "output.weight", args.vocab_size, args.n_embd, be)
                       if "output.weight" in file.tensors else self.embed)
        self._row_runs = _row_runs(be, self.blocks)
        self._state_shapes = tuple(args.state_shapes())  # a hybrid's recurrent layers' (checked every forward)
        self.expert_store: ExpertStore | None = None  # stream_experts
        self.next_token = load_predictor(file, args.next_token_layers, args.n_layers, args.n_embd, args.norm_eps,
                                         self.embed, self.output, self.norm, be)

    def stream_experts(self, options: StreamOptions) -> ExpertStore:
        """Read the layers' experts from the file on demand, into a cache of options.cache_bytes, from now on
        (engine.models.expert_store); the store's stats say what it read. A next-token layer's experts stream too
        (what a draft reads costs the cache as what the model reads does)."""
        if not self.backend.supports_op(OP_MOE_STREAMED):
            raise UnsupportedOnBackend(f"the {self.backend.name} backend cannot stream experts from disk; run the "
                                       f"model on the CPU (--backend cpu)")
        blocks = [*self.blocks, *([self.next_token.block] if self.next_token is not None else [])]
        parts = [(block.index, part) for block in blocks for part in block.moe_parts()]
        if not parts:
            raise ConfigError(f"{self.file.path}: the model has no experts to stream")
        self.expert_store = ExpertStore(self.file.path, options, len(parts))
        for layer, part in parts:
            part.stream_from(self.expert_store, layer)
        if options.prefetch:  # each streamed layer reads ahead for the next
            for (_, part), (_, following) in zip(parts, parts[1:]):
                part.ahead = following
        self._row_runs = _row_runs(self.backend, self.blocks)  # streamed experts run through the composed ops
        return self.expert_store

    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    @property
    def n_layers(self) -> int:
        return self.args.n_layers

    def new_cache(self, capacity: int, dtype: KvDtype | str = KvDtype.F16) -> KvCache:
        if self._state_shapes:
            return HybridCache(*self.args.kv_geometry(), capacity, dtype, self.backend, self.args.kv_value_is_key(),
                               self._state_shapes)
        return KvCache(*self.args.kv_geometry(), capacity, dtype, self.backend, self.args.kv_value_is_key())

    # -- the model interface ----------------------------------------------------------------------------

    def forward(self, tokens: Sequence[int], cache: KvCache) -> np.ndarray:
        """Feed tokens at position cache.len; return the last row's logits [vocab] (a prompt is prefilled;
        a single token is a decode step, row-wise)."""
        self._check_room(len(tokens), cache)
        last = (max(len(tokens) - 1, 0) // UBATCH) * UBATCH
        self._feed_slices(tokens[:last], cache)
        return self._forward([tokens[last:]], [cache], all_rows=False)[0]

    def feed(self, tokens: Sequence[int], cache: KvCache) -> None:
        """forward without the logits."""
        self._check_room(len(tokens), cache)
        self._feed_slices(tokens, cache)

    def _feed_slices(self, tokens: Sequence[int], cache: KvCache) -> None:
        for start in range(0, len(tokens), UBATCH):  # each slice's last row stops at its hidden state
            self._forward([tokens[start : start + UBATCH]], [cache], all_rows=False, head=False)

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
        return all([run.stack.rows_ready(cache.store, wait) for run in self._row_runs if run.stack is not None])

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
        for cache, toks in zip(caches, token_spans):
            cache.feeding(len(toks), row_wise)
        be = self.backend
        ids = self._token_ids(token_spans, n)
        x = self.embed.rows(ids, self.args.embed_scale)
        inputs = self.layer_inputs(ids, x, row_wise) if self.layer_inputs else [None] * self.n_layers
        runs = self._row_runs if row_wise else [_RowRun(self.blocks, None)]
        positions = None
        for run in runs:
            if run.stack is not None:
                run.stack.forward(x, segments)
                continue
            if positions is None:
                positions = np.concatenate([np.arange(s.pos0, s.pos0 + s.row_end - s.row_start) for s in segments])
            for block in run.blocks:
                x = block(x, segments, positions, row_wise, inputs[block.index])
        for cache, s in zip(caches, segments):
            cache.advance(s.row_end - s.row_start)
        self._show_hidden(x, token_spans, caches, segments)
        if not all_rows:
            x = be.take_rows(x, [s.row_end - 1 for s in segments])
        h = be.rmsnorm(x, self.norm, self.args.norm_eps)
        if not head:
            return be.to_host(h)
        logits = be.to_host(self.output(h, row_wise))
        cap = self.args.logit_softcap
        if cap > 0:  # as ggml: scaled by 1 / cap, tanh, scaled by cap, in float32
            logits = np.tanh(logits * np.float32(1.0 / cap)) * np.float32(cap)
        return logits

    def _show_hidden(self, x, token_spans, caches, segments) -> None:
        """Each cache's hidden-state sink (KvCache.hidden_sink) receives its rows' final normed hidden states:
        computed apart, so the logits' bits are the same with a sink or without."""
        sinks = [(cache.hidden_sink, toks, s) for cache, toks, s in zip(caches, token_spans, segments)
                 if getattr(cache, "hidden_sink", None) is not None]
        if not sinks:
            return
        h = self.backend.to_host(self.backend.rmsnorm(x, self.norm, self.args.norm_eps))
        for sink, toks, s in sinks:
            sink(s.pos0, list(toks), h[s.row_start:s.row_end])

    def _segments(self, token_spans, caches) -> list[Segment]:
        if len(token_spans) != len(caches) or len({id(c) for c in caches}) != len(caches):
            raise ValueError("each segment needs its own cache")
        segments, r = [], 0
        for toks, cache in zip(token_spans, caches):
            self._check_cache(cache)
            if len(toks) == 0:
                raise ValueError("empty token span")
            self._check_room(len(toks), cache)
            segments.append(Segment(r, r + len(toks), cache.store, cache.len, cache.state_store))
            r += len(toks)
        return segments

    def _token_ids(self, token_spans, n: int) -> np.ndarray:
        ids = np.fromiter((t for toks in token_spans for t in toks), dtype=np.int64, count=n)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0]
            raise InvalidTokenId(f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")
        return ids

    def _check_cache(self, cache: KvCache) -> None:
        kv_heads, head_dims = self.args.kv_geometry()
        if (cache.kv_heads != tuple(kv_heads) or cache.head_dims != tuple(head_dims)
                or cache.value_is_key != tuple(self.args.kv_value_is_key())
                or tuple(cache.state_shapes) != self._state_shapes):
            raise KvCacheShapeMismatch("the KV cache was made for a different model geometry")
        if cache.backend is not self.backend:
            raise KvCacheShapeMismatch(f"the KV cache lives on the {cache.backend.name} backend; this model runs "
                                       f"on the {self.backend.name} backend")

    @staticmethod
    def _check_room(n: int, cache: KvCache) -> None:
        # checked up front so a long prompt fails before any of it is written
        if cache.len + n > cache.capacity:
            raise KvCacheOverflow(f"context full: {cache.len} + {n} tokens exceed the context of {cache.capacity}")


@dataclass(frozen=True)
class _RowRun:
    """Consecutive layers of the row-wise path: run by the backend's fused stack, or (stack None) each
    through its composed row-wise ops."""

    blocks: list[Block]
    stack: RowStack | None


def _row_runs(backend: Backend, blocks: list[Block]) -> list[_RowRun]:
    """The layers cut into runs the backend's fused row stack takes (every layer whose parts have a fused
    form, when the backend offers one for them) and runs it does not."""
    specs = [b.spec() for b in blocks]
    runs = []
    for fused, group in itertools.groupby(range(len(blocks)), key=lambda i: specs[i] is not None):
        layers = list(group)
        first, end = layers[0], layers[-1] + 1
        stack = backend.row_stack(specs[first:end], first) if fused else None
        runs.append(_RowRun(blocks[first:end], stack))
    return runs
