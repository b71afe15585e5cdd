"""The Mixture-of-Experts feed-forward of m token rows, row-wise, in one kernel call (decode, verify and
batched decode: the fused row stack's experts layer; and the `moe_ffn` op, prefill too).

Row-wise numerics: each row is routed on its own (kernels.cpu.moe_route) and each (row, selected expert)
pair goes through the products a one-row call gives it, so m rows in one call are, row for row, the bits of
m one-row calls. Only the weights are shared: the pairs are grouped by expert, and each selected expert's
gate, up and down rows are read from memory once per call for every row routed to it (as ggml_mul_mat_id
reads them), so verifying m drafted tokens reads the union of their experts, not m times k experts.

The experts' products run in two parallel regions, gate and up of every selected expert in one, down in
the other: the threads split the selected experts' rows, not each expert's, so a one-token step costs two
launches per layer instead of three per expert (the ~400 small parallel regions a layer of per-expert
products would launch each wait for both cores, which a busy desktop rarely offers at once).

Prefill runs here too, in the same two regions: row-wise where its experts have few rows each, and where
they have a dozen or more on average (a 512-token slice routes ~32 to each of Qwen3-30B-A3B's experts) and
their formats have it, through the int8 GEMM (gemm_outputs: each expert's tiles unpacked once for all its
rows; the same pairs and sums, a prefill's own rounding). Which product a share of the work takes is chosen
by the type of the inputs it is given (_multiply), so the row-wise kernels compile without the GEMM's code.
The weighted sum runs in the order the experts were selected, in float32, as llama.cpp's build_moe_ffn adds
its views.
"""

from typing import NamedTuple

import numpy as np
from numba import njit, prange
from numba.core import types
from numba.extending import overload

from kernels.backend import GEGLU, SWIGLU, SWIGLU_OAI
from kernels.common.quant_blocks import KERNEL
from kernels.cpu import lane_gemm, ops
from kernels.cpu.moe_route import route_row
from kernels.cpu.quant_dot import PARALLEL_MIN_BYTES, Activations, activations_split, needs, tiled_product


class Experts(NamedTuple):
    """A MoE feed-forward's experts as the kernel reads them (kernels.backend.MoeSpec's fields)."""

    gate: np.ndarray        # uint8 [n_expert * n_ff, row bytes]: the stacked tensor, expert e's rows at e * n_ff
    up: np.ndarray
    down: np.ndarray        # uint8 [n_expert * n_embd, row bytes]
    types: np.ndarray       # int64 [3]: the GGML types of gate, up and down
    gate_bias: np.ndarray   # float32 [n_expert, n_ff] added to each expert's gate product; [0, 0]: none
    up_bias: np.ndarray
    down_bias: np.ndarray   # [n_expert, n_embd]
    n_expert: int
    n_used: int
    gating: int             # kernels.cpu.moe_route's code of the spec's Gating
    selection_bias: np.ndarray  # float32 [n_expert] added to choose the experts; [0]: none
    n_groups: int           # group-limited routing's expert groups (0: none) and the groups used
    groups_used: int
    normalize: bool
    scale: float
    activation: int         # ACTIVATION_CODES of kernels.backend's expert activation
    down_scale: np.ndarray  # float32 [n_expert]: each expert's down product times it; [0]: none


@njit(**KERNEL, inline="always")
def _act_rows(act, lo, hi):
    """Rows [lo, hi) of the activations (views)."""
    return Activations(act.xs[lo:hi], act.xq[lo:hi], act.xd[lo:hi], act.xsum[lo:hi], act.xs4[lo:hi],
                       act.kq[lo:hi], act.kd[lo:hi], act.kbsums[lo:hi])


def _is_gemm(act) -> bool:
    """Whether a Numba type is the prefill GEMM's inputs (else: the row-wise kernels' Activations)."""
    return isinstance(act, types.BaseNamedTuple) and act.instance_class is lane_gemm.Inputs


def _rows_of(act, lo, hi):
    """Rows [lo, hi) of a product's inputs, either kind (compiled per kind: `overload` below)."""
    raise NotImplementedError


@overload(_rows_of)
def _rows_of_kind(act, lo, hi):
    if _is_gemm(act):
        return lambda act, lo, hi: lane_gemm.input_rows(act, lo, hi)
    return lambda act, lo, hi: _act_rows(act, lo, hi)


def _multiply(formats, qtype, w, X, act, Y):
    """Y = the products of the weight rows w with the rows of X, given act: row-wise from Activations
    (tiled_product), the prefill GEMM's from its inputs (lane_gemm)."""
    raise NotImplementedError


@overload(_multiply)
def _multiply_kind(formats, qtype, w, X, act, Y):
    if _is_gemm(act):
        return lambda formats, qtype, w, X, act, Y: lane_gemm.product(formats, qtype, w, act, Y)
    return lambda formats, qtype, w, X, act, Y: tiled_product(formats, qtype, w, X, act, Y)


@njit(**KERNEL)
def _experts_range(formats, ws, wtypes, count, width, blocks, starts, X, act, Y, lo, hi):
    """The share [lo, hi) of the selected experts' work, laid end to end: expert g's
    weight i of the first `count` of ws is its rows [blocks[g] * width, (blocks[g] + 1) * width), into
    columns [i * width, (i + 1) * width) of Y, times its rows starts[g]:starts[g + 1] of X; each of its weight
    rows costs as many units as it has input rows, so threads given equal shares get equal work however the
    rows were routed."""
    per = count * width
    for g in range(blocks.size):
        n = starts[g + 1] - starts[g]
        first, last = starts[g] * per, starts[g + 1] * per  # the expert's units
        if last <= lo or first >= hi:
            continue
        r0 = (max(lo, first) - first + n - 1) // n  # the weight rows whose first unit falls in the share
        r1 = (min(hi, last) - first + n - 1) // n
        for i in range(count):
            a, b = max(r0, i * width) - i * width, min(r1, (i + 1) * width) - i * width
            if a < b:
                e0, s0, s1 = blocks[g] * width, starts[g], starts[g + 1]
                _multiply(formats, wtypes[i], ws[i][e0 + a : e0 + b], X[s0:s1], _rows_of(act, s0, s1),
                          Y[s0:s1, i * width + a : i * width + b])


@njit(parallel=True, **KERNEL)
def _experts_parallel(formats, ws, wtypes, count, width, blocks, starts, X, act, Y, chunks):
    total = starts[blocks.size] * count * width
    for c in prange(chunks):
        _experts_range(formats, ws, wtypes, count, width, blocks, starts, X, act, Y, c * total // chunks,
                       (c + 1) * total // chunks)


@njit(**KERNEL)
def _experts_products(formats, ws, wtypes, count, width, blocks, starts, X, act, Y, threads):
    """Y = each selected expert's products (the first `count` weights of ws, its rows at blocks[g]) with its
    rows of X, given their inputs act (either kind)."""
    nbytes = blocks.size * count * width * ws[0].shape[1]
    if threads > 1 and nbytes >= PARALLEL_MIN_BYTES:
        _experts_parallel(formats, ws, wtypes, count, width, blocks, starts, X, act, Y, threads)
    else:
        _experts_range(formats, ws, wtypes, count, width, blocks, starts, X, act, Y, 0,
                       starts[blocks.size] * count * width)


@njit(**KERNEL)
def _add_bias(rows, bias, used, starts, col0):
    """Each selected expert's bias row added to its rows' columns from col0 (none when bias is empty)."""
    if bias.shape[0] == 0:
        return
    for g in range(used.size):
        for s in range(starts[g], starts[g + 1]):
            for c in range(bias.shape[1]):
                rows[s, col0 + c] += bias[used[g], c]


_CLAMPED = 3  # gpt-oss's clamped SwiGLU; the others are ops.gated_range's codes
ACTIVATION_CODES = {SWIGLU: ops.SILU, GEGLU: ops.GELU, SWIGLU_OAI: _CLAMPED}


@njit(**KERNEL)
def _swiglu_range(gate_up, activation, hidden, lo, hi):
    """hidden[p] = the activation of pair p's gate and up products (the two halves of gate_up[p])."""
    n_ff = hidden.shape[1]
    for p in range(lo, hi):
        gate, up = gate_up[p, :n_ff], gate_up[p, n_ff:]
        if activation == _CLAMPED:
            ops.swiglu_oai_into(gate, up, ops.OAI_ALPHA, ops.OAI_LIMIT, hidden[p])
        else:
            ops.gated_range(activation, gate, up, hidden[p], 0, n_ff)


@njit(**KERNEL)
def _scale_rows(rows, scale, used, starts):
    """Each selected expert's rows times its scale (none when scale is empty), as ggml multiplies the product."""
    if scale.shape[0] == 0:
        return
    for g in range(used.size):
        s = scale[used[g]]
        for r in range(starts[g], starts[g + 1]):
            for c in range(rows.shape[1]):
                rows[r, c] *= s


@njit(**KERNEL)
def _weighted_range(expert_out, pair, weights, out, lo, hi):
    """out[i] = sum_j weights[i, j] * expert_out[pair[i, j]] for rows [lo, hi), in slot order, in f32."""
    for i in range(lo, hi):
        first, w0 = pair[i, 0], weights[i, 0]
        for c in range(out.shape[1]):
            out[i, c] = expert_out[first, c] * w0
        for j in range(1, pair.shape[1]):
            p, w = pair[i, j], weights[i, j]
            for c in range(out.shape[1]):
                out[i, c] += expert_out[p, c] * w


@njit(parallel=True, **KERNEL)
def _swiglu_parallel(gate_up, activation, hidden, chunks):
    n = hidden.shape[0]
    for c in prange(chunks):
        _swiglu_range(gate_up, activation, hidden, c * n // chunks, (c + 1) * n // chunks)


@njit(parallel=True, **KERNEL)
def _weighted_parallel(expert_out, pair, weights, out, chunks):
    n = out.shape[0]
    for c in prange(chunks):
        _weighted_range(expert_out, pair, weights, out, c * n // chunks, (c + 1) * n // chunks)


# from this many (row, expert) pairs, the elementwise steps pay for parallel launches (a prefill's thousands)
_PAIRS_PARALLEL = 64


@njit(**KERNEL)
def route_and_group(ex, h, logits):
    """Each row of h [m, n_embd] routed by its router logits [m, n_expert] (bias added), and the (row, slot)
    pairs grouped by expert, experts in the order first selected: (used: the experts, starts: where each one's
    pairs start, and the total after them, pair [m, k]: where each (row, slot)'s expert output will sit,
    weights [m, k]: its weight, x [m * k, n_embd]: the pairs' input rows)."""
    m, k = h.shape[0], ex.n_used
    selected = np.empty((m, k), np.int64)
    weights = np.empty((m, k), np.float32)
    for i in range(m):
        route_row(logits[i], k, ex.gating, ex.selection_bias, ex.n_groups, ex.groups_used, ex.normalize,
                  np.float32(ex.scale), selected[i], weights[i])
    group = np.full(ex.n_expert, -1, np.int64)
    used = np.empty(m * k, np.int64)
    counts = np.zeros(m * k + 1, np.int64)
    n_used = 0
    for i in range(m):
        for j in range(k):
            e = selected[i, j]
            if group[e] < 0:
                group[e] = n_used
                used[n_used] = e
                n_used += 1
            counts[group[e] + 1] += 1
    used = used[:n_used]
    starts = np.cumsum(counts[: n_used + 1])
    at = starts.copy()
    pair = np.empty((m, k), np.int64)
    x = np.empty((m * k, h.shape[1]), np.float32)
    for i in range(m):
        for j in range(k):
            g = group[selected[i, j]]
            pair[i, j] = at[g]
            x[at[g]] = h[i]
            at[g] += 1
    return used, starts, pair, weights, x


@njit(**KERNEL)
def _gated_pairs(ex, used, starts, gate_up, threads):
    """The experts' activations of their pairs' gate and up products (biases added to gate_up first)."""
    n_ff = gate_up.shape[1] // 2
    _add_bias(gate_up, ex.gate_bias, used, starts, 0)
    _add_bias(gate_up, ex.up_bias, used, starts, n_ff)
    hidden = np.empty((gate_up.shape[0], n_ff), np.float32)
    if threads > 1 and starts[used.size] >= _PAIRS_PARALLEL:
        _swiglu_parallel(gate_up, ex.activation, hidden, threads)
    else:
        _swiglu_range(gate_up, ex.activation, hidden, 0, starts[used.size])
    return hidden


@njit(**KERNEL)
def _finish_pairs(ex, used, starts, expert_out):
    """The experts' scales and down biases on their pairs' outputs."""
    _scale_rows(expert_out, ex.down_scale, used, starts)
    _add_bias(expert_out, ex.down_bias, used, starts, 0)


@njit(**KERNEL)
def expert_outputs(formats, ex, n_ff, used, blocks, starts, x, threads, expert_out):
    """expert_out[p] = the output of pair p's expert for its input x[p] (its scale and biases applied), the
    pairs of the experts `used` in turn (their n_ff rows of ex's gate and up, and their down rows, at row block
    blocks[g]; their pairs from starts[g], from 0 to the last, starts[used.size]), row-wise."""
    gate_up = np.empty((x.shape[0], 2 * n_ff), np.float32)
    act = activations_split(x, needs(ex.types[:2]), threads)
    _experts_products(formats, (ex.gate, ex.up), ex.types[:2], 2, n_ff, blocks, starts, x, act, gate_up, threads)
    hidden = _gated_pairs(ex, used, starts, gate_up, threads)
    act = activations_split(hidden, needs(ex.types[2:]), threads)
    _experts_products(formats, (ex.down, ex.down), ex.types[2:], 1, expert_out.shape[1], blocks, starts, hidden,
                      act, expert_out, threads)
    _finish_pairs(ex, used, starts, expert_out)


@njit(**KERNEL)
def gemm_outputs(formats, ex, n_ff, used, blocks, starts, x, threads, expert_out):
    """expert_outputs by the prefill GEMM (kernels.cpu.lane_gemm: every type of ex in it): the same outputs
    up to its rounding, each expert's weights unpacked once for all its pairs."""
    gate_up = np.empty((x.shape[0], 2 * n_ff), np.float32)
    _experts_products(formats, (ex.gate, ex.up), ex.types[:2], 2, n_ff, blocks, starts, x,
                      lane_gemm.quantize(x, threads), gate_up, threads)
    hidden = _gated_pairs(ex, used, starts, gate_up, threads)
    _experts_products(formats, (ex.down, ex.down), ex.types[2:], 1, expert_out.shape[1], blocks, starts, hidden,
                      lane_gemm.quantize(hidden, threads), expert_out, threads)
    _finish_pairs(ex, used, starts, expert_out)


@njit(**KERNEL)
def weighted_sum(expert_out, pair, weights, threads, out):
    """out[i] = the weighted sum of row i's experts' outputs, in slot order, in float32."""
    if threads > 1 and pair.size >= _PAIRS_PARALLEL:
        _weighted_parallel(expert_out, pair, weights, out, threads)
    else:
        _weighted_range(expert_out, pair, weights, out, 0, out.shape[0])


@njit(**KERNEL)
def expert_rows(formats, ex, h, logits, threads, out):
    """out [m, n_embd] = the experts' weighted SwiGLU sum for the rows of h [m, n_embd] (normed) with router
    logits [m, n_expert] (bias added); formats holds ex.types."""
    used, starts, pair, weights, x = route_and_group(ex, h, logits)
    expert_out = np.empty((x.shape[0], out.shape[1]), np.float32)
    expert_outputs(formats, ex, ex.gate.shape[0] // ex.n_expert, used, used, starts, x, threads, expert_out)
    weighted_sum(expert_out, pair, weights, threads, out)
