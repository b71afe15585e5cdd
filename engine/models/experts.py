"""The Mixture-of-Experts feed-forward part (llama.cpp's build_moe_ffn, mlx-lm's SwitchGLU): a router
product gives each row's logits over the experts; the gating picks each row's top-k experts and their
weights; the selected experts' SwiGLU outputs, weighted, are summed (the backend's `moe_ffn` op).

The experts' matrices stay in the stacked GGUF tensors ffn_{gate,up,down}_exps, in their own block format,
bound as one weight each (engine.gguf.weights.load_experts): a zero-copy view whose e-th run of rows is
expert e's. Shared experts, when a
family has them, are a dense part added beside this one. gpt-oss adds biases to the router and to every
expert's products (ffn_*.bias: one row per expert) and its clamped SwiGLU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from engine.gguf.reader import GGUFFile
from engine.gguf.weights import LinearWeight, load_experts, load_vectors
from engine.models.layout import TensorSpec, bias, experts, matrix
from engine.models.parts import first_problem, shown
from kernels.backend import OP_LINEAR, OP_MOE_FFN, SWIGLU, SWIGLU_OAI, Backend, Gating, MoeFfnSpec, MoeSpec


@dataclass(frozen=True)
class MoeArgs:
    OPS = (OP_LINEAR, OP_MOE_FFN)  # the backend ops the part runs on
    n_expert: int
    n_used: int  # experts per row (top k)
    n_ff: int  # each expert's feed-forward width
    gating: Gating = Gating.SOFTMAX
    normalize: bool = True  # the selected weights divided by their sum
    scale: float = 1.0  # then multiplied by this
    activation: str = SWIGLU  # or SWIGLU_OAI (kernels.backend)
    biases: bool = False  # on the router and on each expert's gate, up and down products

    @staticmethod
    def names(p: str, kind: str = "weight") -> tuple[str, str, str, str]:
        """The router's and the stacked gate, up and down tensors' names in layer `p` (kind "bias": their
        biases')."""
        return tuple(f"{p}ffn_{w}.{kind}" for w in ("gate_inp", "gate_exps", "up_exps", "down_exps"))

    def tensors(self, p: str, n_embd: int) -> list[TensorSpec]:
        e, f = self.n_expert, self.n_ff
        router, gate, up, down = self.names(p)
        tensors = [matrix(router, e, n_embd), experts(gate, e, f, n_embd), experts(up, e, f, n_embd),
                   experts(down, e, n_embd, f)]
        if self.biases:
            router_b, gate_b, up_b, down_b = self.names(p, "bias")
            tensors += [bias(router_b, e), bias(gate_b, e, f), bias(up_b, e, f), bias(down_b, e, n_embd)]
        return tensors

    def build(self, file: GGUFFile, p: str, layer: int, n_embd: int, backend: Backend) -> "MoeFfn":
        return MoeFfn(self, file, p, n_embd, backend)

    @staticmethod
    def check_layers(arch: str, layers: Sequence["MoeArgs"]) -> str | None:
        counts, used = [f.n_expert for f in layers], [f.n_used for f in layers]
        return first_problem([
            (all(f.n_expert >= 1 for f in layers), f"{arch}.expert_count is {shown(counts)}; it must be positive"),
            (all(1 <= f.n_used <= f.n_expert for f in layers),
             f"{arch}.expert_used_count is {shown(used)}; it must be between 1 and expert_count ({shown(counts)})"),
            (all(f.n_ff >= 1 for f in layers), f"{arch}.expert_feed_forward_length must be positive"),
            (all(math.isfinite(f.scale) and f.scale > 0 for f in layers),
             f"{arch}: the experts' weights scale must be positive"),
            (all(f.activation in (SWIGLU, SWIGLU_OAI) for f in layers), f"{arch}: an unknown experts' activation"),
        ])


class MoeFfn:
    def __init__(self, args: MoeArgs, file: GGUFFile, p: str, n_embd: int, backend: Backend):
        self.backend = backend
        router, gate, up, down = args.names(p)
        router_b, gate_b, up_b, down_b = args.names(p, "bias") if args.biases else (None,) * 4
        e, f = args.n_expert, args.n_ff

        def expert_biases(name, width):
            return None if name is None else load_vectors(file, name, (e, width))

        self.router = LinearWeight.load(file, router, e, n_embd, backend, router_b)
        self.experts = MoeSpec(gate=load_experts(file, gate, e, f, n_embd, backend),
                               up=load_experts(file, up, e, f, n_embd, backend),
                               down=load_experts(file, down, e, n_embd, f, backend),
                               n_expert=e, n_used=args.n_used, gating=args.gating, normalize=args.normalize,
                               scale=args.scale, activation=args.activation, gate_bias=expert_biases(gate_b, f),
                               up_bias=expert_biases(up_b, f), down_bias=expert_biases(down_b, n_embd))

    def __call__(self, h, row_wise: bool):
        return self.backend.moe_ffn(self.experts, h, self.router(h, row_wise), row_wise)

    def spec(self) -> MoeFfnSpec:
        return MoeFfnSpec(router=self.router.handle, experts=self.experts)
