"""One decoder layer for one token in one kernel call.

At decode a layer is a chain of small steps (norm, q/k/v, RoPE, cache write,
attention, output, residual, norm, gate/up, activation, down, residual); run
one by one from Python they cost more in calls than in arithmetic on small
models. Here the chain runs inside Numba: the matvecs and attention still
split over threads, each in its own parallel region, and the elementwise steps
stay on the calling thread.

A layer is described by
- `ws`: its seven weights (q, k, v, o, gate, up, down) as read-only uint8 GGUF
  block arrays, with their GGML types in `qtypes`;
- `vecs`: float32 vectors (attention norm, FFN norm, post-attention norm,
  post-FFN norm, q norm, k norm, q/k/v biases); an empty vector leaves its
  step out;
- `geo`: int64 (heads, kv heads, head dim, RoPE dims, RoPE NeoX style,
  activation, sliding window), `eps`, `rope_base`, `scale`.
The K/V cache rows are f16 bit patterns [capacity, kv_heads, head_dim].
"""

import numpy as np
from numba import njit

from kernels.cpu import ops
from kernels.cpu.attention import decode_heads
from kernels.cpu.f16 import f32_to_f16_bits
from kernels.cpu.quant_blocks import KERNEL
from kernels.cpu.quant_dot import matvec_stacked

ATTN_NORM, FFN_NORM, POST_ATTN_NORM, POST_FFN_NORM, Q_NORM, K_NORM, Q_BIAS, K_BIAS, V_BIAS = range(9)
WQ, WK, WV, WO, W_GATE, W_UP, W_DOWN = range(7)


@njit(**KERNEL)
def _norm(x, w, eps, out):
    ops.rmsnorm_row(x, w, eps, out)


@njit(**KERNEL)
def _add(x, v):
    for i in range(x.size):
        x[i] += v[i]


@njit(**KERNEL)
def _store_f16(rows, dst):
    """dst[h, c] = f16(rows[h, c]) (what the cache's own encoder stores)."""
    for h in range(rows.shape[0]):
        for c in range(rows.shape[1]):
            dst[h, c] = f32_to_f16_bits(rows[h, c])


@njit(**KERNEL)
def decode_layer(x, ws, qtypes, vecs, geo, eps, rope_base, scale, kc, vc, pos, threads):
    """x [n_embd] += the layer's attention and FFN outputs for the token at position pos,
    whose keys and values are written to kc[pos], vc[pos]."""
    n_head, n_kv, hd, n_rot, neox, act, window = geo[0], geo[1], geo[2], geo[3], geo[4] != 0, geo[5], geo[6]
    eps = np.float32(eps)
    h = np.empty_like(x)
    _norm(x, vecs[ATTN_NORM], eps, h)

    qkv = np.empty((n_head + 2 * n_kv) * hd, np.float32)
    matvec_stacked(qtypes[WQ:WO], (ws[WQ], ws[WK], ws[WV]), h, qkv, threads)
    q = qkv[: n_head * hd]
    k = qkv[n_head * hd : (n_head + n_kv) * hd]
    v = qkv[(n_head + n_kv) * hd :]
    if vecs[Q_BIAS].size:
        _add(q, vecs[Q_BIAS])
        _add(k, vecs[K_BIAS])
        _add(v, vecs[V_BIAS])
    q3, k3 = q.reshape(1, n_head, hd), k.reshape(1, n_kv, hd)
    if vecs[Q_NORM].size:
        for i in range(n_head):
            _norm(q3[0, i], vecs[Q_NORM], eps, q3[0, i])
        for i in range(n_kv):
            _norm(k3[0, i], vecs[K_NORM], eps, k3[0, i])
    positions = np.full(1, pos, np.int64)
    ops.rope_inplace(q3, positions, n_rot, rope_base, neox)
    ops.rope_inplace(k3, positions, n_rot, rope_base, neox)
    _store_f16(k3[0], kc[pos])
    _store_f16(v.reshape(n_kv, hd), vc[pos])

    attn = np.empty((n_head, hd), np.float32)
    decode_heads(q3[0], kc, vc, pos + 1, window, np.float32(scale), attn)
    a = np.empty_like(x)
    matvec_stacked(qtypes[WO:W_GATE], (ws[WO],), attn.reshape(-1), a, threads)
    if vecs[POST_ATTN_NORM].size:
        _norm(a, vecs[POST_ATTN_NORM], eps, a)
    _add(x, a)

    _norm(x, vecs[FFN_NORM], eps, h)
    n_ff = ws[W_GATE].shape[0]
    gate_up = np.empty(2 * n_ff, np.float32)
    matvec_stacked(qtypes[W_GATE:W_DOWN], (ws[W_GATE], ws[W_UP]), h, gate_up, threads)
    gated = np.empty(n_ff, np.float32)
    ops.gated_range(act, gate_up[:n_ff], gate_up[n_ff:], gated, 0, n_ff)
    matvec_stacked(qtypes[W_DOWN:], (ws[W_DOWN],), gated, a, threads)
    if vecs[POST_FFN_NORM].size:
        _norm(a, vecs[POST_FFN_NORM], eps, a)
    _add(x, a)
