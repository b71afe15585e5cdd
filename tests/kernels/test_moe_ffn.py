"""The CPU's Mixture-of-Experts op (kernels.cpu.moe, moe_route, expert_rows): llama.cpp's routing (softmax, top
k with ties to the lower index, normalized weights; gpt-oss's softmax over the selected logits; DeepSeek-V3's
sigmoid with a bias that chooses but does not weight) and the
experts' weighted SwiGLU sum (gpt-oss's: clamped, with biases) against a NumPy reference."""

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from kernels.backend import SWIGLU_OAI, Gating, MoeSpec
from kernels.cpu import quant
from kernels.cpu.moe_route import route
from kernels.cpu.backend import CpuBackend
from tests.quant_weights import random_weight

N_EXPERT, K, N_EMBD, N_FF = 6, 3, 64, 32


def test_routing_picks_the_largest_best_first_and_ties_to_the_lower_index():
    logits = np.array([[0.5, 2.0, 1.0, 2.0, -1.0, 1.0]], np.float32)
    selected, weights = route(logits, K, Gating.SOFTMAX, normalize=False, scale=1.0)
    assert selected.tolist() == [[1, 3, 2]]
    probs = np.exp(logits[0] - logits.max()) / np.exp(logits[0] - logits.max()).sum()
    np.testing.assert_allclose(weights[0], probs[[1, 3, 2]], rtol=1e-6)


def test_softmax_weight_gating_ranks_the_logits_then_softmaxes_the_selected():
    logits = np.array([[0.5, 2.0, 1.0, 2.0, -1.0, 1.0]], np.float32)
    selected, weights = route(logits, K, Gating.SOFTMAX_WEIGHT, normalize=False, scale=1.0)
    assert selected.tolist() == [[1, 3, 2]]
    top = logits[0, [1, 3, 2]]
    np.testing.assert_allclose(weights[0], np.exp(top - top.max()) / np.exp(top - top.max()).sum(), rtol=1e-6)


def test_sigmoid_gating_chooses_by_the_biased_probabilities_and_weights_by_the_unbiased_ones():
    logits = np.array([[0.5, 2.0, 1.0, 2.0, -1.0, 1.0]], np.float32)
    bias = np.array([0.0, -0.5, 0.0, 0.0, 0.9, 0.0], np.float32)  # expert 4 first, 1 dropped below 2
    selected, weights = route(logits, K, Gating.SIGMOID, normalize=False, scale=1.0, selection_bias=bias)
    probs = 1 / (1 + np.exp(-logits[0]))
    assert selected.tolist() == [[4, 3, 2]] == [list(np.argsort(-(probs + bias), kind="stable")[:K])]
    np.testing.assert_allclose(weights[0], probs[[4, 3, 2]], rtol=1e-6)
    unbiased, _ = route(logits, K, Gating.SIGMOID, normalize=False, scale=1.0)
    assert unbiased.tolist() == [[1, 3, 2]]


def test_group_limited_routing_chooses_within_the_groups_whose_two_best_sum_highest():
    logits = np.array([[3.0, -5.0, 2.8, 2.8, -3.0, -3.0]], np.float32)  # groups of two: e^3, 2 e^2.8, 2 e^-3
    selected, weights = route(logits, 2, Gating.SOFTMAX, normalize=False, scale=1.0, groups=(3, 1))
    assert selected.tolist() == [[2, 3]]  # the best expert (0) is in a group not chosen
    probs = np.exp(logits[0] - logits.max()) / np.exp(logits[0] - logits.max()).sum()
    np.testing.assert_allclose(weights[0], probs[[2, 3]], rtol=1e-6)
    assert route(logits, 2, Gating.SOFTMAX, normalize=False, scale=1.0, groups=(3, 2))[0].tolist() == [[0, 2]]


def test_normalized_weights_sum_to_one_then_scale():
    logits = np.random.default_rng(0).normal(0, 3, (5, N_EXPERT)).astype(np.float32)
    _, weights = route(logits, K, Gating.SOFTMAX, normalize=True, scale=2.5)
    np.testing.assert_allclose(weights.sum(axis=1), 2.5, rtol=1e-6)


def _experts(rng, backend, qtype=T.F32, gpt_oss=False, n_embd=N_EMBD, n_ff=N_FF):
    def stacked(rows, cols):
        raw = random_weight(qtype, N_EXPERT * rows, cols, rng)
        if qtype == T.F32:
            raw = (raw.view(np.float32) * np.float32(0.1)).view(np.uint8)
        return backend.upload_weight(qtype, raw, N_EXPERT * rows, cols)

    experts = dict(gate=stacked(n_ff, n_embd), up=stacked(n_ff, n_embd), down=stacked(n_embd, n_ff),
                   n_expert=N_EXPERT, n_used=K)
    if not gpt_oss:
        return MoeSpec(**experts, gating=Gating.SOFTMAX, normalize=True, scale=1.0)
    biases = {f"{w}_bias": rng.normal(0, 0.5, (N_EXPERT, n)).astype(np.float32)
              for w, n in (("gate", n_ff), ("up", n_ff), ("down", n_embd))}
    return MoeSpec(**experts, gating=Gating.SOFTMAX_WEIGHT, normalize=False, scale=1.0, activation=SWIGLU_OAI,
                   **biases)


def _reference(spec: MoeSpec, x, logits):
    """Each row alone, in float64, with dequantized experts."""
    def dense(w, e):
        rows = w.out_dim // N_EXPERT
        return quant.gather_rows(w.qtype, w.raw, np.arange(e * rows, (e + 1) * rows)).astype(np.float64)

    def bias(b, e):
        return 0 if b is None else b[e]

    def sigmoid(v):  # without exp's overflow
        return 0.5 * (1 + np.tanh(v / 2))

    def activation(g, u):
        if spec.activation != SWIGLU_OAI:
            return g * sigmoid(g) * u
        g, u = np.minimum(g, 7), np.clip(u, -7, 7)
        return g * sigmoid(1.702 * g) * (u + 1)

    selected, weights = route(logits, spec.n_used, spec.gating, spec.normalize, spec.scale)
    out = np.zeros(x.shape)
    for r, row in enumerate(x.astype(np.float64)):
        for e, w in zip(selected[r], weights[r]):
            g = dense(spec.gate, e) @ row + bias(spec.gate_bias, e)
            u = dense(spec.up, e) @ row + bias(spec.up_bias, e)
            out[r] += w * (dense(spec.down, e) @ activation(g, u) + bias(spec.down_bias, e))
    return out


@pytest.mark.parametrize("gpt_oss", [False, True], ids=["swiglu", "gpt-oss"])
@pytest.mark.parametrize("row_wise", [True, False], ids=["rows", "prefill"])
def test_the_weighted_sum_of_the_selected_experts(row_wise, gpt_oss):
    rng = np.random.default_rng(1)
    backend = CpuBackend()
    spec = _experts(rng, backend, gpt_oss=gpt_oss)
    x = rng.standard_normal((40, N_EMBD)).astype(np.float32)  # past 16 rows an expert: the prefill GEMM
    logits = rng.normal(0, 3, (40, N_EXPERT)).astype(np.float32)
    out = backend.moe_ffn(spec, x, logits, row_wise)
    np.testing.assert_allclose(out, _reference(spec, x, logits), rtol=1e-4, atol=1e-5)


# every experts' format with a native kernel; wide enough that the selected experts' products split over threads
@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4], ids=lambda t: t.name)
def test_rows_are_their_one_row_bits_on_quantized_experts(qtype):
    rng = np.random.default_rng(2)
    backend = CpuBackend()
    spec = _experts(rng, backend, qtype, n_embd=256, n_ff=256)
    x = rng.standard_normal((33, 256)).astype(np.float32)  # 33 rows: 99 (row, expert) pairs, split over threads
    logits = rng.normal(0, 3, (33, N_EXPERT)).astype(np.float32)
    alone = np.concatenate([backend.moe_ffn(spec, x[r : r + 1], logits[r : r + 1], row_wise=True) for r in range(33)])
    np.testing.assert_allclose(alone, _reference(spec, x, logits), rtol=0.05, atol=0.05 * np.abs(alone).max())
    for m in (2, 5, 8, 17, 33):
        together = backend.moe_ffn(spec, x[:m], logits[:m], row_wise=True)
        np.testing.assert_array_equal(together, alone[:m], err_msg=f"{m} rows in one call")
