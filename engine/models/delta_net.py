"""The Gated DeltaNet mixer (Qwen3.5's linear-attention layers): a recurrent state instead of KV rows.

From the normed input: the mixed projection attn_qkv [q | k | v] (n_k heads of q and k, n_v of v, all of
`head` dims), the output gate attn_gate (z), and the per-value-head alpha and beta logits; the backend's
OP_DELTA_NET runs the short causal conv and the gated delta rule on the conversation's state (its
arithmetic: kernels/cpu/delta_net.py); then per head an RMSNorm (ssm_norm) times silu(z), and ssm_out.
As llama.cpp's qwen35 graph (src/models/qwen35.cpp, delta-net-base.cpp).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.gguf.reader import GGUFFile
from engine.gguf.weights import LinearGroup, LinearWeight, load_vector, load_vectors
from engine.models.layout import TensorSpec, bias, matrix, norm
from engine.models.parts import first_problem, shown
from kernels.backend import OP_DELTA_NET, OP_GATED, OP_LINEAR, OP_RMSNORM, Backend, DeltaNetSpec, Segment


@dataclass(frozen=True)
class DeltaNetArgs:
    MEMORY = "state"  # what it keeps per conversation: a recurrent state (engine.kv.recurrent)
    OPS = (OP_LINEAR, OP_RMSNORM, OP_GATED, OP_DELTA_NET)

    n_k: int  # query/key heads (ssm.group_count)
    n_v: int  # value heads (ssm.time_step_rank)
    head: int  # each head's size (ssm.state_size; ssm.inner_size / n_v)
    d_conv: int  # the causal conv's taps (ssm.conv_kernel)

    @property
    def channels(self) -> int:
        """The conv's channels: q, k and v."""
        return (2 * self.n_k + self.n_v) * self.head

    def tensors(self, p: str, n_embd: int) -> list[TensorSpec]:
        value = self.n_v * self.head
        return [matrix(p + "attn_qkv.weight", self.channels, n_embd), matrix(p + "attn_gate.weight", value, n_embd),
                matrix(p + "ssm_alpha.weight", self.n_v, n_embd), matrix(p + "ssm_beta.weight", self.n_v, n_embd),
                bias(p + "ssm_conv1d.weight", self.channels, self.d_conv), bias(p + "ssm_dt.bias", self.n_v),
                bias(p + "ssm_a", self.n_v), norm(p + "ssm_norm.weight", self.head),
                matrix(p + "ssm_out.weight", n_embd, value)]

    def state_shape(self) -> tuple[tuple[int, int], tuple[int, int, int]]:
        """What the layer keeps per conversation: (conv window, delta-rule state)."""
        return (self.d_conv - 1, self.channels), (self.n_v, self.head, self.head)

    def build(self, file: GGUFFile, p: str, layer: int, n_embd: int, eps: float, backend: Backend) -> "DeltaNet":
        return DeltaNet(self, file, p, layer, n_embd, eps, backend)

    @staticmethod
    def check_layers(arch: str, layers: Sequence["DeltaNetArgs"]) -> str | None:
        a = layers[0]
        return first_problem([
            (a.n_k >= 1 and a.n_v >= 1 and a.n_v % a.n_k == 0,
             f"{arch}.ssm.group_count {a.n_k} must divide ssm.time_step_rank {a.n_v}"),
            (a.head >= 1, f"{arch}.ssm.state_size is {a.head}; it must be positive and ssm.inner_size / "
                          f"ssm.time_step_rank"),
            (all(x.d_conv >= 1 for x in layers), f"{arch}.ssm.conv_kernel {shown([x.d_conv for x in layers])} "
                                                 f"must be positive"),
        ])


class DeltaNet:
    def __init__(self, args: DeltaNetArgs, file: GGUFFile, p: str, layer: int, n_embd: int, eps: float,
                 backend: Backend):
        a = args
        value = a.n_v * a.head
        self.backend = backend
        self.layer = layer
        self.eps = eps
        self.inputs = LinearGroup([LinearWeight.load(file, p + name, rows, n_embd, backend) for name, rows in (
            ("attn_qkv.weight", a.channels), ("attn_gate.weight", value), ("ssm_alpha.weight", a.n_v),
            ("ssm_beta.weight", a.n_v))])
        self.recurrence = DeltaNetSpec(
            n_k=a.n_k, n_v=a.n_v, head=a.head, eps=float(eps),
            conv_w=backend.upload_vector(load_vectors(file, p + "ssm_conv1d.weight", (a.channels, a.d_conv)).T),
            dt_bias=backend.upload_vector(load_vector(file, p + "ssm_dt.bias", a.n_v)),
            a=backend.upload_vector(load_vector(file, p + "ssm_a", a.n_v)))
        self.norm = backend.upload_vector(load_vector(file, p + "ssm_norm.weight", a.head))
        self.out = LinearWeight.load(file, p + "ssm_out.weight", n_embd, value, backend)

    def __call__(self, h, segments: Sequence[Segment], positions: np.ndarray, row_wise: bool):
        be = self.backend
        mixed, z, alpha, beta = self.inputs(h, row_wise)
        o = be.delta_net(self.recurrence, mixed, alpha, beta, segments, self.layer)
        o = be.gated("silu", z, be.rmsnorm(o, self.norm, self.eps))
        return self.out(o, row_wise)

    def spec(self) -> None:
        return None  # no fused row-wise form: the layer runs through the composed ops
