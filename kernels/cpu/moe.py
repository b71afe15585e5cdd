"""The Mixture-of-Experts feed-forward on the CPU (kernels.backend.Backend.moe_ffn): experts with native kernels
in one kernel call, row-wise or prefill alike (kernels.cpu.expert_rows), save a long prefill's K-quant experts,
which take the int8 GEMM (kernels.cpu.lane_gemm) with rows enough per expert. Experts of another type run the
generic products per selected expert (row-wise: kernels.cpu.quant.rows, each row on its own; prefill:
kernels.cpu.quant.matmul over the rows routed to it, its weights read once per call, as ggml_mul_mat_id
reads them) on zero-copy views of the expert's rows in the stacked tensors, and their weighted sum in the
order the experts were selected, in f32, as llama.cpp's build_moe_ffn adds its views. Experts read from disk on
demand (a MoeSpec's source) take the native kernels' path in groups as many as the source holds at once.
"""

from __future__ import annotations

import numpy as np

from kernels.backend import GEGLU, SWIGLU_OAI, ExpertSource, MoeSpec
from kernels.common import formats
from kernels.cpu import lane_gemm, ops, quant
from kernels.cpu.expert_rows import (
    ACTIVATION_CODES, Experts, expert_outputs, expert_rows, gemm_outputs, route_and_group, weighted_sum,
)
from kernels.cpu.moe_route import GATING_CODES, route, selection_bias_of

_NO_BIAS = np.zeros((0, 0), np.float32)
_NO_SCALE = np.zeros(0, np.float32)


def kernel_experts(spec: MoeSpec) -> Experts:
    """The spec's experts as expert_rows reads them."""
    def bias(b):
        return _NO_BIAS if b is None else np.ascontiguousarray(b, np.float32)

    return Experts(gate=quant.kernel_weight(spec.gate.qtype, spec.gate.raw),
                   up=quant.kernel_weight(spec.up.qtype, spec.up.raw),
                   down=quant.kernel_weight(spec.down.qtype, spec.down.raw),
                   types=np.array([spec.gate.qtype, spec.up.qtype, spec.down.qtype], np.int64),
                   gate_bias=bias(spec.gate_bias), up_bias=bias(spec.up_bias), down_bias=bias(spec.down_bias),
                   n_expert=spec.n_expert, n_used=spec.n_used, gating=GATING_CODES[spec.gating],
                   selection_bias=selection_bias_of(spec.selection_bias), n_groups=int(spec.n_groups),
                   groups_used=int(spec.groups_used), normalize=bool(spec.normalize),
                   scale=float(spec.scale), activation=ACTIVATION_CODES[spec.activation],
                   down_scale=_NO_SCALE if spec.down_scale is None else np.ascontiguousarray(spec.down_scale,
                                                                                             np.float32))


def moe_ffn(spec: MoeSpec, x: np.ndarray, router_logits: np.ndarray, row_wise: bool) -> np.ndarray:
    """sum_j weight_j * down_e(act(gate_e(x), up_e(x))) over each row's selected experts e (plus the experts'
    biases, when they have them)."""
    x = np.ascontiguousarray(x, np.float32)
    logits = np.ascontiguousarray(router_logits, np.float32)
    out = np.empty((x.shape[0], spec.down.out_dim // spec.n_expert), np.float32)
    if all(quant.has_native_kernel(w.qtype) for w in (spec.gate, spec.up, spec.down)):
        experts = kernel_experts(spec)
        # a prefill's experts may take the int8 GEMM where their formats have it (_by_groups decides)
        gemm = not row_wise and all(lane_gemm.supports(int(t)) for t in experts.types)
        if spec.source is None and not gemm:
            expert_rows(formats.of(experts.types), experts, x, logits, quant.threads(), out)
        else:
            _by_groups(spec.source, experts, x, logits, gemm, out)
        return out
    if spec.source is not None:
        raise ValueError("experts read on demand need a native kernel for their formats")
    selected, weights = route(logits, spec.n_used, spec.gating, spec.normalize, spec.scale, spec.selection_bias,
                              (spec.n_groups, spec.groups_used))
    outputs = np.empty((x.shape[0], spec.n_used, out.shape[1]), np.float32)  # row, slot: its expert's output
    for e in np.unique(selected):
        rows, slots = np.nonzero(selected == e)  # a row selects an expert at most once
        outputs[rows, slots] = _expert(spec, e, x[rows], quant.rows if row_wise else quant.matmul)
    np.multiply(outputs[:, 0], weights[:, :1], out=out)
    for j in range(1, spec.n_used):
        out += outputs[:, j] * weights[:, j : j + 1]
    return out


def _by_groups(source: ExpertSource | None, experts: Experts, x: np.ndarray, logits: np.ndarray, gemm: bool,
               out: np.ndarray) -> None:
    """expert_rows' work, the experts mapped (source None) or read from `source`: the routed experts made
    resident in the groups the source gives (as many as its slots hold), each group's pair outputs computed
    from its slots as the mapped experts' are (the same bits); then the one weighted sum. With `gemm`, the
    pair outputs come from the int8 GEMM (gemm_outputs) where the experts have enough rows on average for its
    unpacking of each to pay (lane_gemm.MIN_INPUT_ROWS), else row-wise (expert_outputs)."""
    fmt, threads = formats.of(experts.types), quant.threads()
    used, starts, pair, weights, pairs_x = route_and_group(experts, x, logits)
    outputs = gemm_outputs if gemm and starts[-1] >= lane_gemm.MIN_INPUT_ROWS * used.size else expert_outputs
    n_ff = experts.gate.shape[0] // experts.n_expert
    expert_out = np.empty((pairs_x.shape[0], out.shape[1]), np.float32)
    if source is None:
        outputs(fmt, experts, n_ff, used, used, starts, pairs_x, threads, expert_out)
        weighted_sum(expert_out, pair, weights, threads, out)
        return
    resident = experts._replace(gate=source.gate, up=source.up, down=source.down)
    counts = np.diff(starts)
    for groups, slots in source.acquire_groups(used, counts):
        if groups.size == used.size:  # one group, the pairs as they lie
            outputs(fmt, resident, n_ff, used, slots, starts, pairs_x, threads, expert_out)
            continue
        rows = np.concatenate([np.arange(starts[g], starts[g + 1]) for g in groups])
        part = np.empty((rows.size, out.shape[1]), np.float32)
        outputs(fmt, resident, n_ff, used[groups], slots, np.concatenate([[0], np.cumsum(counts[groups])]),
                pairs_x[rows], threads, part)
        expert_out[rows] = part
    weighted_sum(expert_out, pair, weights, threads, out)


def _expert(spec: MoeSpec, e: int, x: np.ndarray, product) -> np.ndarray:
    """Expert e's output for the rows x, through `product` (quant.matmul or quant.rows)."""
    def product_of(weight, inputs, bias, scale=None):  # the product, times the expert's scale, plus its bias
        rows = weight.out_dim // spec.n_expert
        y = product(weight.qtype, weight.raw[e * rows : (e + 1) * rows], inputs)
        if scale is not None:
            y *= np.float32(scale[e])
        if bias is not None:
            y += bias[e]
        return y

    gate, up = product_of(spec.gate, x, spec.gate_bias), product_of(spec.up, x, spec.up_bias)
    hidden = {SWIGLU_OAI: ops.swiglu_oai, GEGLU: ops.gelu_mul}.get(spec.activation, ops.silu_mul)(gate, up)
    return product_of(spec.down, hidden, spec.down_bias, spec.down_scale)
