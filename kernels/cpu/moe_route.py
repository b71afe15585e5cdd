"""Mixture-of-Experts routing as llama.cpp's build_moe_ffn does it: each row's top-k experts and their weights
from its router logits. Each row is routed on its own; its arithmetic is scalar and its own."""

import numpy as np
from numba import njit, prange

from kernels.backend import Gating
from kernels.common.quant_blocks import KERNEL

# llama.cpp clamps the sum of the selected weights before dividing by it: the smallest normal f16
_MIN_WEIGHT_SUM = np.float32(6.103515625e-5)


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


@njit(**KERNEL, inline="always")
def route_row(logits, k, softmax_first, normalize, scale, selected, weights):
    """One row's k best experts (best first) into selected and their weights into weights. softmax_first:
    softmax over the experts, then the k largest probabilities; else the k largest logits, then a softmax
    over those k (SOFTMAX_WEIGHT). Then the weights divided by their sum when `normalize`, times `scale`
    (float32)."""
    if softmax_first:
        probs = np.empty(logits.size, np.float32)
        _softmax_into(logits, probs)
        _top_k(probs, k, selected, weights)
    else:
        top = np.empty(k, np.float32)
        _top_k(logits, k, selected, top)
        _softmax_into(top, weights)
    if normalize:
        total = np.float32(0)
        for j in range(k):
            total += weights[j]
        total = max(total, _MIN_WEIGHT_SUM)
        for j in range(k):
            weights[j] /= total
    for j in range(k):
        weights[j] *= scale


@njit(cache=True, parallel=True)
def _route(logits, k, softmax_first, normalize, scale, selected, weights):
    for r in prange(logits.shape[0]):
        route_row(logits[r], k, softmax_first, normalize, scale, selected[r], weights[r])


def route(logits: np.ndarray, k: int, gating: Gating, normalize: bool, scale: float):
    """Each row's selected experts, best first (int64 [n, k]) and their weights (float32 [n, k])."""
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    selected = np.empty((logits.shape[0], k), np.int64)
    weights = np.empty((logits.shape[0], k), np.float32)
    _route(logits, k, gating == Gating.SOFTMAX, normalize, np.float32(scale), selected, weights)
    return selected, weights
