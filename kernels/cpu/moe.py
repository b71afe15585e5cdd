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

from kernels.backend import Gating, MoeSpec
from kernels.cpu import ops

# llama.cpp clamps the sum of the selected weights before dividing by it: the smallest normal f16
_MIN_WEIGHT_SUM = np.float32(6.103515625e-5)

Product = Callable[[int, np.ndarray, np.ndarray], np.ndarray]  # (qtype, weight bytes, x [n, in]) -> [n, out]


@njit(cache=True, parallel=True)
def _route_softmax(logits, k, normalize, scale, selected, weights):
    """Per row: softmax over the experts, the k largest (ties: the lower index first, a stable descending
    sort's order), their probabilities (divided by their sum when `normalize`) times `scale`."""
    n, n_expert = logits.shape
    for r in prange(n):
        row = logits[r]
        top = row.max()
        probs = np.empty(n_expert, np.float32)
        total = 0.0  # float64, as ggml's softmax sums
        for e in range(n_expert):
            probs[e] = np.exp(row[e] - top)
            total += probs[e]
        inv = np.float32(1.0 / total)
        for e in range(n_expert):
            probs[e] *= inv
        taken = np.zeros(n_expert, np.bool_)
        for j in range(k):
            best = -1
            for e in range(n_expert):
                if not taken[e] and (best < 0 or probs[e] > probs[best]):
                    best = e
            taken[best] = True
            selected[r, j] = best
            weights[r, j] = probs[best]
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
    if gating != Gating.SOFTMAX:
        raise ValueError(f"the CPU has no {gating.value} gating")
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    selected = np.empty((logits.shape[0], k), np.int64)
    weights = np.empty((logits.shape[0], k), np.float32)
    _route_softmax(logits, k, normalize, np.float32(scale), selected, weights)
    return selected, weights


def moe_ffn(spec: MoeSpec, x: np.ndarray, router_logits: np.ndarray, product: Product) -> np.ndarray:
    """sum_j weight_j * down_e(silu(gate_e(x)) * up_e(x)) over each row's selected experts e, each expert's
    products by `product` over the rows routed to it."""
    selected, weights = route(router_logits, spec.n_used, spec.gating, spec.normalize, spec.scale)
    n_embd = spec.down[0].out_dim
    outputs = np.empty((x.shape[0], spec.n_used, n_embd), np.float32)  # row, slot: its expert's output
    for e in np.unique(selected):
        rows, slots = np.nonzero(selected == e)  # a row selects an expert at most once
        xe = x[rows]
        gate, up, down = spec.gate[e], spec.up[e], spec.down[e]
        hidden = ops.silu_mul(product(gate.qtype, gate.raw, xe), product(up.qtype, up.raw, xe))
        outputs[rows, slots] = product(down.qtype, down.raw, hidden)
    out = outputs[:, 0] * weights[:, :1]
    for j in range(1, spec.n_used):
        out += outputs[:, j] * weights[:, j : j + 1]
    return out
