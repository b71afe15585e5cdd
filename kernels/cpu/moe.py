"""The Mixture-of-Experts feed-forward on the CPU (kernels.backend.Backend.moe_ffn): routing as a Numba
kernel, the experts' products through the existing weight products (kernels.cpu.quant) on zero-copy views of
the stacked expert tensors.

Each row is routed on its own (the kernel's arithmetic per row is scalar and its own), and an expert runs
once per call over the rows routed to it, so its weights are read once per call, as ggml_mul_mat_id reads
them. Which product runs (row-wise or prefill) is the caller's choice; with the row-wise one every row gets
the bits it gets alone. The weighted sum runs in the order the experts were selected, in f32, as
llama.cpp's build_moe_ffn adds its views.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from kernels.backend import SWIGLU, SWIGLU_OAI, Gating, MoeSpec
from kernels.cpu import ops

# llama.cpp clamps the sum of the selected weights before dividing by it: the smallest normal f16
_MIN_WEIGHT_SUM = np.float32(6.103515625e-5)

Product = Callable[[int, np.ndarray, np.ndarray], np.ndarray]  # (qtype, weight bytes, x [n, in]) -> [n, out]


@njit(cache=True, inline="always")
def _top_k(scores, k, selected, weights):
    """The k largest of scores (ties: the lower index first, a stable descending sort's order) into
    selected, their scores into weights."""
    taken = np.zeros(scores.size, np.bool_)
    for j in range(k):
        best = -1
        for e in range(scores.size):
            if not taken[e] and (best < 0 or scores[e] > scores[best]):
                best = e
        taken[best] = True
        selected[j] = best
        weights[j] = scores[best]


@njit(cache=True, inline="always")
def _softmax_into(row, out):
    """out = softmax(row) as ggml_soft_max: exp(x - max) in f32, their sum in float64, times 1 / sum."""
    top = row.max()
    total = 0.0  # float64, as ggml's softmax sums
    for e in range(row.size):
        out[e] = np.exp(row[e] - top)
        total += out[e]
    inv = np.float32(1.0 / total)
    for e in range(row.size):
        out[e] *= inv


@njit(cache=True, parallel=True)
def _route(logits, k, softmax_first, normalize, scale, selected, weights):
    """Per row: the k best experts and their weights. softmax_first: softmax over the experts, then the k
    largest probabilities; else the k largest logits, then a softmax over those k (SOFTMAX_WEIGHT). Then
    the weights divided by their sum when `normalize`, times `scale`."""
    n, n_expert = logits.shape
    for r in prange(n):
        if softmax_first:
            probs = np.empty(n_expert, np.float32)
            _softmax_into(logits[r], probs)
            _top_k(probs, k, selected[r], weights[r])
        else:
            top = np.empty(k, np.float32)
            _top_k(logits[r], k, selected[r], top)
            _softmax_into(top, weights[r])
        if normalize:
            total_w = np.float32(0)
            for j in range(k):
                total_w += weights[r, j]
            total_w = max(total_w, _MIN_WEIGHT_SUM)
            for j in range(k):
                weights[r, j] /= total_w
        for j in range(k):
            weights[r, j] *= scale


def route(logits: np.ndarray, k: int, gating: Gating, normalize: bool, scale: float):
    """Each row's selected experts, best first (int64 [n, k]) and their weights (float32 [n, k])."""
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    selected = np.empty((logits.shape[0], k), np.int64)
    weights = np.empty((logits.shape[0], k), np.float32)
    _route(logits, k, gating == Gating.SOFTMAX, normalize, np.float32(scale), selected, weights)
    return selected, weights


def _biased(y: np.ndarray, bias: np.ndarray | None, e: int) -> np.ndarray:
    if bias is not None:
        y += bias[e]
    return y


_ACTIVATIONS = {SWIGLU: ops.silu_mul, SWIGLU_OAI: ops.swiglu_oai}


def moe_ffn(spec: MoeSpec, x: np.ndarray, router_logits: np.ndarray, product: Product) -> np.ndarray:
    """sum_j weight_j * down_e(act(gate_e(x), up_e(x))) over each row's selected experts e, each expert's
    products by `product` over the rows routed to it (plus the expert's biases, when it has them)."""
    selected, weights = route(router_logits, spec.n_used, spec.gating, spec.normalize, spec.scale)
    n_embd = spec.down[0].out_dim
    activation = _ACTIVATIONS[spec.activation]
    outputs = np.empty((x.shape[0], spec.n_used, n_embd), np.float32)  # row, slot: its expert's output
    for e in np.unique(selected):
        rows, slots = np.nonzero(selected == e)  # a row selects an expert at most once
        xe = x[rows]
        gate, up, down = spec.gate[e], spec.up[e], spec.down[e]
        hidden = activation(_biased(product(gate.qtype, gate.raw, xe), spec.gate_bias, e),
                            _biased(product(up.qtype, up.raw, xe), spec.up_bias, e))
        outputs[rows, slots] = _biased(product(down.qtype, down.raw, hidden), spec.down_bias, e)
    out = outputs[:, 0] * weights[:, :1]
    for j in range(1, spec.n_used):
        out += outputs[:, j] * weights[:, j : j + 1]
    return out
