"""Multi-head latent attention on the CPU (kernels.backend.Backend.latent_attention), in the absorbed form
llama.cpp's deepseek2 graph runs: one cached row per position (the normed latent, then the RoPE'd key part),
attended by every head as multi-query attention of one KV head whose values are the same rows, and each
head's latent output taken to its value width by v_b. The per-head products run through the backend's
linear op, so the row-wise path keeps its contract (each row the bits it gets alone); the row-wise attention
over an f16 cache reads it in place, as the fused row stack does (the cache never widened), and the prefill's
(or a q8_0 cache's) is the backend's own."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kernels.backend import LatentAttentionSpec, Segment
from kernels.cpu import ops
from kernels.cpu.attention_lanes import attend_rows

_NO_SINKS = np.zeros(0, np.float32)


def latent_attention(backend, spec: LatentAttentionSpec, q: np.ndarray, kv: np.ndarray,
                     segments: Sequence[Segment], positions: np.ndarray, layer: int, row_wise: bool) -> np.ndarray:
    n, nh, rank, nope, rd = q.shape[0], spec.n_head, spec.rank, spec.nope, spec.rope_dims
    q = q.reshape(n, nh, nope + rd)
    q_rope = np.ascontiguousarray(q[:, :, nope:])
    ops.rope(q_rope, positions, rd, spec.rope_base, spec.rope_neox, spec.rope_scaling)
    k_rope = np.ascontiguousarray(kv[:, rank:]).reshape(n, 1, rd)
    ops.rope(k_rope, positions, rd, spec.rope_base, spec.rope_neox, spec.rope_scaling)
    key = np.empty((n, rank + rd), np.float32)  # the cached row: the normed latent, then the RoPE'd part
    key[:, :rank] = ops.rmsnorm(np.ascontiguousarray(kv[:, :rank]), spec.kv_norm, spec.eps)
    key[:, rank:] = k_rope[:, 0]
    query = np.empty((n, nh, rank + rd), np.float32)
    for h in range(nh):  # each head's non-RoPE query absorbed into the latent space
        query[:, h, :rank] = _product(backend, spec.k_b[h], q[:, h, :nope], row_wise)
    query[:, :, rank:] = q_rope
    if row_wise and all(s.store.dtype == "f16" for s in segments):
        latents = _attend_f16_rows(query, key, segments, layer, spec.shape.scale)
    else:
        latents = backend.attention(query.reshape(n, -1), key, key, segments, layer, spec.shape, row_wise)
    latents = latents.reshape(n, nh, rank + rd)
    out = np.empty((n, nh, spec.v_dim), np.float32)
    for h in range(nh):
        out[:, h] = _product(backend, spec.v_b[h], latents[:, h, :rank], row_wise)
    return out.reshape(n, -1)


def _attend_f16_rows(query: np.ndarray, key: np.ndarray, segments: Sequence[Segment], layer: int,
                     scale: float) -> np.ndarray:
    """The row-wise attention over an f16 cache: each segment's rows written, then each query row over the
    cached rows up to its own, read as f16 in place (the fused row stack's kernel: every row its own bits)."""
    out = np.empty_like(query)
    for s in segments:
        r0, r1, store = s.row_start, s.row_end, s.store
        rows = key[r0:r1, None, :]
        store.write_f32(layer, s.pos0, rows, rows)
        n_keys = np.arange(s.pos0 + 1, s.pos0 + 1 + (r1 - r0), dtype=np.int64)
        cached = store.k[layer]  # the latent rows, read as keys and as values
        attend_rows(query[r0:r1], cached, cached, n_keys, 0, np.float32(scale), _NO_SINKS, out[r0:r1])
    return out


def _product(backend, weight, x: np.ndarray, row_wise: bool) -> np.ndarray:
    return backend.linear([weight], np.ascontiguousarray(x), row_wise)[0]
