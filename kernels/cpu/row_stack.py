"""The fused row-wise stack: a run of decoder layers over m token rows in one kernel call.

Row-wise numerics: each row goes through exactly the arithmetic of a one-token step (its own int8
activation quantization, the same dot products in the same order, attention over the keys up to its own
position), so one call over m rows gives, row for row, the bits of m one-token calls. Only the weights are
shared: each tile of a weight is read from memory once and multiplied by every row while it sits in L2.
This is what makes verifying m drafted tokens cost little more than decoding one; it serves decode,
speculative verification and batched decode alike. (Prefill takes the other path, engine.models.block's
Block: dequantized tiles and BLAS, faster for long prompts but with numerics that depend on the batch
shape.) A model whose layers are not all of the kinds this stack knows runs a stack per run of layers it
knows (`kcs` then holds the caches of that run's layers only).

At decode a layer is a chain of small steps (norm, q/k/v, RoPE, cache write, attention, output, residual,
norm, gate/up, activation, down, residual); run one by one from Python they cost more in calls than in
arithmetic on small models, so the whole stack of layers runs here in one call. Products and attention
split over threads, each in its own parallel region; elementwise steps stay on the calling thread.

A layer is a `Layer` (a named tuple: weights as read-only uint8 GGUF block arrays with their GGML type ids,
float32 vectors where an empty one leaves its step out, and the attention geometry); its feed-forward is a
gated MLP (`Mlp`) or a Mixture of Experts (`ExpertsFfn`), a kind the kernel is compiled for (a stack's
layers share one). The K/V cache of row i
is `kcs[slots[i] * n_layers + layer]` (f16 bit patterns [capacity, kv_heads, head_dim], or q8_0 blocks
[capacity, kv_heads, head_dim / 32 * 34]) and row i sits at position `positions[i]`. Rows of one cache come
in position order; all rows' keys and values are written before any row attends, and row i reads keys
[0, positions[i]], so later rows of the same call never leak into earlier ones.
"""

from typing import NamedTuple

import numpy as np
from numba import njit, types
from numba.extending import overload

from kernels.common.f16 import f32_to_f16_bits
from kernels.common.q8_0 import dequantize_rows, quantize_row
from kernels.common.quant_blocks import KERNEL
from kernels.cpu import ops
from kernels.cpu.attention import decode_rows
from kernels.cpu.attention_lanes import attend_rows
from kernels.cpu.expert_rows import Experts, expert_rows
from kernels.cpu.quant_dot import parallel_chunks, products


class RowArgs(NamedTuple):
    """forward_rows' arguments after the format set, by name."""

    x: np.ndarray          # [m, n_embd] float32, the rows' embeddings; the layers' outputs are added in place
    layers: object         # typed.List of Layer
    k_caches: object       # typed.List: row i's layer li keys are k_caches[slots[i] * len(layers) + li]
    v_caches: object
    slots: np.ndarray      # int64 [m]: which cache each row belongs to
    positions: np.ndarray  # int64 [m]: each row's position in its cache
    threads: int


class Mlp(NamedTuple):
    """A gated MLP feed-forward."""

    gate_up: tuple           # gate, up weights
    gate_up_types: np.ndarray
    down: tuple              # down weight
    down_types: np.ndarray
    activation: int          # ops.SILU or ops.GELU


class ExpertsFfn(NamedTuple):
    """A Mixture-of-Experts feed-forward: the router's product (plus its bias, when not empty) routes each row
    to its experts (kernels.cpu.expert_rows)."""

    router: tuple
    router_types: np.ndarray
    router_bias: np.ndarray
    experts: Experts


class Layer(NamedTuple):
    qkv: tuple               # q, k, v weights (each group of weights as quant_dot.stack pads it)
    qkv_types: np.ndarray    # their GGML type ids, int64
    out: tuple               # attention output weight
    out_types: np.ndarray
    ffn: tuple               # the feed-forward: a Mlp or an ExpertsFfn
    attn_norm: np.ndarray
    ffn_norm: np.ndarray
    post_attn_norm: np.ndarray  # Gemma's norms after attention and FFN (empty: none)
    post_ffn_norm: np.ndarray
    q_norm: np.ndarray       # per-head q/k norms (empty: none)
    k_norm: np.ndarray
    q_bias: np.ndarray       # q/k/v biases (empty: none)
    k_bias: np.ndarray
    v_bias: np.ndarray
    out_bias: np.ndarray     # the attention output's bias (empty: none)
    sinks: np.ndarray        # a logit per head in the softmax's denominator (empty: none)
    n_head: int
    n_kv: int
    head_dim: int
    rope_dims: int
    rope_neox: bool
    rope_base: float
    rope_inv: np.ndarray     # scaled RoPE: each pair's inverse frequency, float64 (empty: from rope_base)
    rope_magnitude: float    # scaled RoPE: what cos and sin are multiplied by
    window: int              # sliding window; 0 = global attention
    eps: float
    attn_scale: float


@njit(**KERNEL)
def _norm_rows(x, w, eps, out):
    for i in range(x.shape[0]):
        ops.rmsnorm_row(x[i], w, eps, out[i])


@njit(**KERNEL)
def _add(x, v):
    for i in range(x.size):
        x[i] += v[i]


def store_rows(rows, dst):
    """dst = rows [kv_heads, head_dim] in the cache's storage form (Numba-only; per cache dtype)."""
    raise NotImplementedError


@overload(store_rows, inline="always")
def _store_rows_overload(rows, dst):
    if dst.dtype == types.uint16:  # f16 bits, as the cache's own encoder stores them
        def store_f16(rows, dst):
            for h in range(rows.shape[0]):
                for c in range(rows.shape[1]):
                    dst[h, c] = f32_to_f16_bits(rows[h, c])
        return store_f16

    def store_q8_0(rows, dst):
        for h in range(rows.shape[0]):
            quantize_row(rows[h], dst[h])
    return store_q8_0


def attend(formats, q, kc, vc, n_keys, window, scale, sinks, out):
    """Attention of rows q [m, heads, head_dim] of one cache, row i over its rows [0, n_keys[i]): in vector
    lanes where there are enough queries and the format set has the lanes, else head by head (Numba-only)."""
    raise NotImplementedError


@overload(attend, inline="always")
def _attend_overload(formats, q, kc, vc, n_keys, window, scale, sinks, out):
    rows = attend_rows if formats.lanes else decode_rows
    if kc.dtype == types.uint16:
        return lambda formats, q, kc, vc, n_keys, window, scale, sinks, out: rows(q, kc, vc, n_keys, window, scale,
                                                                                  sinks, out)

    def attend_q8_0(formats, q, kc, vc, n_keys, window, scale, sinks, out):  # the values a dequantized cache holds
        n = n_keys.max()
        rows(q, dequantize_rows(kc[:n]), dequantize_rows(vc[:n]), n_keys, window, scale, sinks, out)
    return attend_q8_0


@njit(**KERNEL)
def _rope(x, pos, layer):
    """RoPE on x [1, heads, head_dim] at pos, scaled where the layer's is."""
    if layer.rope_inv.size:
        ops.rope_scaled(x, pos, layer.rope_inv, np.float32(layer.rope_magnitude), layer.rope_neox)
    else:
        ops.rope_inplace(x, pos, layer.rope_dims, layer.rope_base, layer.rope_neox)


# _attention and the feed-forwards stay functions of their own: inlined into forward_rows (one compile unit fewer on
# the first run) they made SmolLM2's decode layers 24% slower
@njit(**KERNEL)
def _attention(formats, x, layer, li, n_layers, kcs, vcs, slots, positions, threads, h, out):
    """out [m, n_embd] = the attention block's output for the rows of x, given h = its normed input."""
    m = x.shape[0]
    n_head, n_kv, hd = layer.n_head, layer.n_kv, layer.head_dim
    qkv = np.empty((m, (n_head + 2 * n_kv) * hd), np.float32)
    products(formats, layer.qkv_types, layer.qkv, h, qkv, parallel_chunks(layer.qkv, threads))
    eps = np.float32(layer.eps)
    q3 = np.empty((m, n_head, hd), np.float32)
    for i in range(m):
        row = qkv[i]
        q = row[: n_head * hd]
        k = row[n_head * hd : (n_head + n_kv) * hd]
        v = row[(n_head + n_kv) * hd :]
        if layer.q_bias.size:
            _add(q, layer.q_bias)
            _add(k, layer.k_bias)
            _add(v, layer.v_bias)
        qi, ki = q.reshape(1, n_head, hd), k.reshape(1, n_kv, hd)
        if layer.q_norm.size:
            for j in range(n_head):
                ops.rmsnorm_row(qi[0, j], layer.q_norm, eps, qi[0, j])
            for j in range(n_kv):
                ops.rmsnorm_row(ki[0, j], layer.k_norm, eps, ki[0, j])
        pos = positions[i : i + 1]
        _rope(qi, pos, layer)
        _rope(ki, pos, layer)
        for j in range(n_head):  # element by element: an array copy compiles a shape check and its message
            for c in range(hd):
                q3[i, j, c] = qi[0, j, c]
        cache = slots[i] * n_layers + li
        store_rows(ki[0], kcs[cache][positions[i]])
        store_rows(v.reshape(n_kv, hd), vcs[cache][positions[i]])
    attn = np.empty((m, n_head, hd), np.float32)
    n_keys = positions + 1
    i0 = 0
    while i0 < m:  # every row's keys are in the cache now; row i reads up to its own position
        i1 = i0 + 1
        while i1 < m and slots[i1] == slots[i0]:  # the run of rows of one cache attends together
            i1 += 1
        cache = slots[i0] * n_layers + li
        attend(formats, q3[i0:i1], kcs[cache], vcs[cache], n_keys[i0:i1], layer.window, np.float32(layer.attn_scale),
               layer.sinks, attn[i0:i1])
        i0 = i1
    attn = attn.reshape(m, n_head * hd)
    products(formats, layer.out_types, layer.out, attn, out, parallel_chunks(layer.out, threads))
    if layer.out_bias.size:
        for i in range(m):
            _add(out[i], layer.out_bias)
    if layer.post_attn_norm.size:
        _norm_rows(out, layer.post_attn_norm, eps, out)


@njit(**KERNEL)
def _mlp(formats, mlp, h, threads, out):
    """out [m, n_embd] = the gated MLP's output for its normed input h."""
    m = h.shape[0]
    n_ff = mlp.gate_up[0].shape[0]
    gate_up = np.empty((m, 2 * n_ff), np.float32)
    products(formats, mlp.gate_up_types, mlp.gate_up, h, gate_up, parallel_chunks(mlp.gate_up, threads))
    gated = np.empty((m, n_ff), np.float32)
    for i in range(m):
        ops.gated_range(mlp.activation, gate_up[i, :n_ff], gate_up[i, n_ff:], gated[i], 0, n_ff)
    products(formats, mlp.down_types, mlp.down, gated, out, parallel_chunks(mlp.down, threads))


@njit(**KERNEL)
def _experts(formats, ffn, h, threads, out):
    """out [m, n_embd] = the experts' output for their normed input h."""
    logits = np.empty((h.shape[0], ffn.experts.n_expert), np.float32)
    products(formats, ffn.router_types, ffn.router, h, logits, parallel_chunks(ffn.router, threads))
    if ffn.router_bias.size:
        for i in range(h.shape[0]):
            _add(logits[i], ffn.router_bias)
    expert_rows(formats, ffn.experts, h, logits, threads, out)


def feed_forward(formats, ffn, h, threads, out):
    """out [m, n_embd] = the feed-forward's output for its normed input h (Numba-only; per kind of part)."""
    raise NotImplementedError


@overload(feed_forward, inline="always")
def _feed_forward_overload(formats, ffn, h, threads, out):
    if getattr(ffn, "instance_class", None) is ExpertsFfn:
        return lambda formats, ffn, h, threads, out: _experts(formats, ffn, h, threads, out)
    return lambda formats, ffn, h, threads, out: _mlp(formats, ffn, h, threads, out)


@njit(**KERNEL)
def forward_rows(formats, x, layers, kcs, vcs, slots, positions, threads):
    """x [m, n_embd] (the rows' embeddings) += every layer's attention and FFN outputs, in place; row i's
    keys and values are written to its cache at positions[i]. formats (kernels.common.formats) holds the types
    of every layer's weights."""
    n_layers = len(layers)
    h = np.empty_like(x)
    a = np.empty_like(x)
    for li in range(n_layers):
        layer = layers[li]
        eps = np.float32(layer.eps)
        _norm_rows(x, layer.attn_norm, eps, h)
        _attention(formats, x, layer, li, n_layers, kcs, vcs, slots, positions, threads, h, a)
        for i in range(x.shape[0]):
            _add(x[i], a[i])
        _norm_rows(x, layer.ffn_norm, eps, h)
        feed_forward(formats, layer.ffn, h, threads, a)
        if layer.post_ffn_norm.size:
            _norm_rows(a, layer.post_ffn_norm, eps, a)
        for i in range(x.shape[0]):
            _add(x[i], a[i])
