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


# Gating as the kernels take it (an int: njit code branches on it)
SOFTMAX, SOFTMAX_WEIGHT, SIGMOID = 0, 1, 2
GATING_CODES = {Gating.SOFTMAX: SOFTMAX, Gating.SOFTMAX_WEIGHT: SOFTMAX_WEIGHT, Gating.SIGMOID: SIGMOID}
NO_SELECTION_BIAS = np.zeros(0, np.float32)


@njit(**KERNEL, inline="always")
def _in_best_groups(scores, n_groups, groups_used):
    """DeepSeek-V3's group-limited routing: the experts in n_groups runs, each run scored by the sum of its two
    best scores; `scores` with every expert outside the groups_used best runs at -inf."""
    per_group = scores.size // n_groups
    group_scores = np.empty(n_groups, np.float32)
    best = np.empty(2, np.int64)
    best_scores = np.empty(2, np.float32)
    for g in range(n_groups):
        _top_k(scores[g * per_group : (g + 1) * per_group], 2, best, best_scores)
        group_scores[g] = best_scores[0] + best_scores[1]
    chosen = np.empty(groups_used, np.int64)
    chosen_scores = np.empty(groups_used, np.float32)
    _top_k(group_scores, groups_used, chosen, chosen_scores)
    masked = np.full(scores.size, -np.inf, np.float32)
    for g in chosen:
        masked[g * per_group : (g + 1) * per_group] = scores[g * per_group : (g + 1) * per_group]
    return masked


@njit(**KERNEL, inline="always")
def route_row(logits, k, gating, selection_bias, n_groups, groups_used, normalize, scale, selected, weights):
    """One row's k best experts (best first) into selected and their weights into weights. gating SOFTMAX:
    softmax over the experts, then the k largest probabilities; SIGMOID: the same of each logit's sigmoid;
    SOFTMAX_WEIGHT: the k largest logits, then a softmax over those k. A selection_bias (size n_expert; size
    0: none) is added to the probabilities to choose the k, whose weights stay the unbiased ones; with
    n_groups > 1 the k are chosen among the experts of the groups_used best groups only. Then the weights
    divided by their sum when `normalize`, times `scale` (float32)."""
    probs = np.empty(logits.size, np.float32)
    if gating == SOFTMAX:
        _softmax_into(logits, probs)
    elif gating == SIGMOID:
        for e in range(logits.size):  # ggml_sigmoid: 1 / (1 + expf(-x))
            probs[e] = np.float32(1) / (np.float32(1) + np.exp(-logits[e]))
    else:
        probs[:] = logits
    scores = probs + selection_bias if selection_bias.size else probs
    if n_groups > 1:
        scores = _in_best_groups(scores, n_groups, groups_used)
    _top_k(scores, k, selected, weights)
    for j in range(k):  # the unbiased probabilities
        weights[j] = probs[selected[j]]
    if gating == SOFTMAX_WEIGHT:
        _softmax_into(weights.copy(), weights)
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
def _route(logits, k, gating, selection_bias, n_groups, groups_used, normalize, scale, selected, weights):
    for r in prange(logits.shape[0]):
        route_row(logits[r], k, gating, selection_bias, n_groups, groups_used, normalize, scale, selected[r],
                  weights[r])


def selection_bias_of(bias) -> np.ndarray:
    """A spec's selection bias as route_row takes it."""
    return NO_SELECTION_BIAS if bias is None else np.ascontiguousarray(bias, np.float32)


def route(logits: np.ndarray, k: int, gating: Gating, normalize: bool, scale: float, selection_bias=None,
          groups: tuple[int, int] = (0, 0)):
    """Each row's selected experts, best first (int64 [n, k]) and their weights (float32 [n, k]); `groups`:
    (expert groups, the groups used) of group-limited routing, (0, 0) for none."""
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    selected = np.empty((logits.shape[0], k), np.int64)
    weights = np.empty((logits.shape[0], k), np.float32)
    _route(logits, k, GATING_CODES[gating], selection_bias_of(selection_bias), *groups, normalize,
           np.float32(scale), selected, weights)
    return selected, weights
