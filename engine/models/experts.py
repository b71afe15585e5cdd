"""The Mixture-of-Experts feed-forward part (llama.cpp's build_moe_ffn, mlx-lm's SwitchGLU): a router
product gives each row's logits over the experts; the gating picks each row's top-k experts and their
weights; the selected experts' SwiGLU outputs, weighted, are summed (the backend's `moe_ffn` op).

The experts' matrices stay in the stacked GGUF tensors ffn_{gate,up,down}_exps, in their own block format,
bound as one weight each (engine.gguf.weights.load_experts): a zero-copy view whose e-th run of rows is
expert e's. gpt-oss adds biases to the router and to every expert's products (ffn_*.bias: one row per expert)
and its clamped SwiGLU. The DeepSeek lineage adds shared experts (a gated MLP every row runs, ffn_*_shexp, its
output added to the experts'), sigmoid gating, and a bias added to the probabilities to choose the experts
but not to weight them (exp_probs_b).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from engine.errors import ConfigError, UnsupportedWeightType
from engine.gguf.meta import ZeroPolicy, meta_float_opt, meta_int, meta_int_opt, meta_value
from engine.gguf.reader import GGUFFile
from engine.gguf.weights import LinearWeight, load_experts, load_vector, load_vectors
from engine.models.expert_store import ExpertStore
from engine.models.feed_forward import GatedMlp, GatedMlpArgs
from engine.models.layout import BIAS, TensorSpec, bias, experts, matrix
from engine.models.parts import first_problem, shown
from kernels.backend import (
    EXPERT_ACTIVATIONS, OP_GATED_SIGMOID, OP_LINEAR, OP_MOE_FFN, SWIGLU, Backend, Gating, MoeFfnSpec, MoeSpec,
)


@dataclass(frozen=True)
class MoeArgs:
    n_expert: int
    n_used: int  # experts per row (top k)
    n_ff: int  # each expert's feed-forward width
    gating: Gating = Gating.SOFTMAX
    normalize: bool = True  # the selected weights divided by their sum
    scale: float = 1.0  # then multiplied by this
    activation: str = SWIGLU  # one of kernels.backend's EXPERT_ACTIVATIONS
    biases: bool = False  # on the router and on each expert's gate, up and down products
    selection_bias: bool = False  # the file may hold exp_probs_b, added to the gated probabilities to choose
                                  # the experts (llama.cpp: TENSOR_NOT_REQUIRED)
    n_shared_ff: int = 0  # the shared experts' width together (ffn_*_shexp); 0: none
    shared_gate: bool = False  # the shared experts' output times sigmoid(x . ffn_gate_inp_shexp) (Qwen3.5)
    n_groups: int = 0  # group-limited routing (kernels.backend.MoeSpec): expert groups, 0 for none
    groups_used: int = 0

    @property
    def OPS(self) -> tuple[str, ...]:
        """The backend ops the part runs on."""
        return (OP_LINEAR, OP_MOE_FFN, *(GatedMlpArgs.OPS if self.n_shared_ff else ()),
                *((OP_GATED_SIGMOID,) if self.shared_gate else ()))

    @property
    def shared(self) -> GatedMlpArgs | None:
        return GatedMlpArgs(self.n_shared_ff, suffix="_shexp") if self.n_shared_ff else None

    def groups_fit(self) -> bool:
        """Group-limited routing's groups: equal runs of two or more experts, the used ones holding k experts."""
        if not self.n_groups:
            return True
        per_group = self.n_expert // self.n_groups
        return (self.n_expert % self.n_groups == 0 and per_group >= 2 and 1 <= self.groups_used <= self.n_groups
                and self.n_used <= self.groups_used * per_group)

    @staticmethod
    def selection_bias_name(p: str) -> str:
        return p + "exp_probs_b.bias"

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
        if self.selection_bias:
            tensors.append(TensorSpec(self.selection_bias_name(p), (e,), BIAS, required=False))
        if self.shared is not None:
            tensors += self.shared.tensors(p, n_embd)
        if self.shared_gate:
            tensors.append(bias(self.shared_gate_name(p), n_embd))
        return tensors

    @staticmethod
    def shared_gate_name(p: str) -> str:
        return p + "ffn_gate_inp_shexp.weight"

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
            (all(f.activation in EXPERT_ACTIVATIONS for f in layers), f"{arch}: an unknown experts' activation"),
            (all(f.n_shared_ff >= 0 for f in layers), f"{arch}: the shared experts' width must not be negative"),
            (all(f.n_shared_ff or not f.shared_gate for f in layers), f"{arch}: a shared experts' gate without them"),
            (all(f.groups_fit() for f in layers),
             f"{arch}.expert_group_count {shown([f.n_groups for f in layers])} must split the experts into groups of "
             f"two or more, and expert_group_used_count ({shown([f.groups_used for f in layers])}) must be between 1 "
             f"and it, its groups holding the experts used"),
        ])


# a call of at most this many rows (decode, a short verify) prefetches the next layer's experts; a prefill's rows
# route to most of them anyway
PREFETCH_ROWS = 4


class MoeFfn:
    def __init__(self, args: MoeArgs, file: GGUFFile, p: str, n_embd: int, backend: Backend):
        self.backend = backend
        router, gate, up, down = args.names(p)
        router_b, gate_b, up_b, down_b = args.names(p, "bias") if args.biases else (None,) * 4
        e, f = args.n_expert, args.n_ff

        def expert_biases(name, width):
            return None if name is None else load_vectors(file, name, (e, width))

        self.router = LinearWeight.load(file, router, e, n_embd, backend, router_b)
        self.ahead: MoeFfn | None = None  # the next streamed layer's part, whose experts this one prefetches
        self._stacks = tuple(file.tensor(name) for name in (gate, up, down))  # where streaming reads them
        self.experts = MoeSpec(gate=load_experts(file, gate, e, f, n_embd, backend),
                               up=load_experts(file, up, e, f, n_embd, backend),
                               down=load_experts(file, down, e, n_embd, f, backend),
                               n_expert=e, n_used=args.n_used, gating=args.gating, normalize=args.normalize,
                               scale=args.scale, activation=args.activation, gate_bias=expert_biases(gate_b, f),
                               up_bias=expert_biases(up_b, f), down_bias=expert_biases(down_b, n_embd),
                               selection_bias=self._selection_bias(args, file, p), n_groups=args.n_groups,
                               groups_used=args.groups_used, down_scale=self._down_scale(args, file, p))
        self.shared = None if args.shared is None else GatedMlp(args.shared, file, p, n_embd, backend)
        self.shared_gate = (LinearWeight.load_row(file, args.shared_gate_name(p), n_embd, backend)
                            if args.shared_gate else None)

    @staticmethod
    def _selection_bias(args: MoeArgs, file: GGUFFile, p: str):
        name = args.selection_bias_name(p)
        return load_vector(file, name, args.n_expert) if args.selection_bias and name in file.tensors else None

    @staticmethod
    def _down_scale(args: MoeArgs, file: GGUFFile, p: str):
        """Each expert's down-product scale where the file has one (as llama.cpp loads ffn_down_exps.scale for
        every family: Gemma 4's per_expert_scale), else None."""
        name = p + "ffn_down_exps.scale"
        return load_vector(file, name, args.n_expert) if name in file.tensors else None

    def __call__(self, h, row_wise: bool):
        logits = self.router(h, row_wise)
        if self.ahead is not None and h.shape[0] <= PREFETCH_ROWS:
            self.ahead.prefetch_for(h)
        out = self.backend.moe_ffn(self.experts, h, logits, row_wise)
        if self.shared is not None:  # llama.cpp adds the shared experts' output to the routed ones'
            shared = self.shared(h, row_wise)
            if self.shared_gate is not None:
                shared = self.backend.gated("sigmoid", self.shared_gate(h, row_wise), shared)
            out = self.backend.add(out, shared)
        return out

    def spec(self) -> MoeFfnSpec | None:
        """The fused row stack's form; shared experts and streamed ones have none yet (the layer runs through the
        composed ops)."""
        if self.shared is not None or self.experts.source is not None:
            return None
        return MoeFfnSpec(router=self.router.handle, experts=self.experts)

    def prefetch_for(self, h) -> None:
        """Start reading the experts this layer's router picks for h, an earlier layer's input (the residual
        stream changes little from one layer to the next): a guess that decides what is read, never what is
        computed."""
        logits = np.asarray(self.router(h, True))
        k = self.experts.n_used
        picks = np.argpartition(-logits, k - 1, axis=1)[:, :k] if k < logits.shape[1] else np.arange(logits.shape[1])
        self.experts.source.prefetch(np.unique(picks))

    def stream_from(self, store: ExpertStore, layer: int) -> None:
        """Read the experts from `store` on demand from now on, not through the file's mapping."""
        slow = [info.name for info in self._stacks if not self.backend.native(info.ggml_type)]
        if slow:
            raise UnsupportedWeightType(f"{store.path}: {', '.join(slow)} have a format the {self.backend.name} "
                                        f"backend has no kernels of its own for, which streaming needs")
        self.experts = replace(self.experts, source=store.layer(layer, *self._stacks, self.experts.n_expert))


def routed_experts(meta: Mapping, arch: str, unset_gating: Gating) -> MoeArgs:
    """The experts of the DeepSeek and GLM lineages as llama.cpp reads their "<arch>.*" keys: expert_count and
    expert_used_count, expert_feed_forward_length (else the dense width split over the used experts),
    expert_gating_func (1 softmax, 2 sigmoid; unset: `unset_gating`), expert_weights_norm and _scale (0 or 1:
    unscaled), expert_shared_count shared experts of the same width, expert_group_count and _used_count
    (group-limited routing), and the selection bias exp_probs_b where the file has it."""
    func = meta_int_opt(meta, arch, "expert_gating_func", ZeroPolicy.ACCEPT_ZERO) or 0
    if func not in _GATING_FUNCS:
        raise ConfigError(f"model metadata {arch}.expert_gating_func is {func}; supported: 1 (softmax), 2 (sigmoid)")
    n_used = meta_int(meta, arch, "expert_used_count")
    n_ff = (meta_int_opt(meta, arch, "expert_feed_forward_length")
            or meta_int(meta, arch, "feed_forward_length") // n_used)
    scale = meta_float_opt(meta, arch, "expert_weights_scale", 0.0)
    shared = meta_int_opt(meta, arch, "expert_shared_count", ZeroPolicy.ACCEPT_ZERO) or 0
    groups = meta_int_opt(meta, arch, "expert_group_count") or 0
    grouped = groups > 1
    return MoeArgs(n_expert=meta_int(meta, arch, "expert_count"), n_used=n_used, n_ff=n_ff,
                   gating=_GATING_FUNCS[func] or unset_gating,
                   normalize=bool(meta_value(meta, f"{arch}.expert_weights_norm", "bool")),
                   scale=scale if scale not in (0.0, 1.0) else 1.0, selection_bias=True, n_shared_ff=n_ff * shared,
                   n_groups=groups if grouped else 0,
                   groups_used=(meta_int_opt(meta, arch, "expert_group_used_count") or 0) if grouped else 0)


_GATING_FUNCS = {0: None, 1: Gating.SOFTMAX, 2: Gating.SIGMOID}  # llama.cpp's expert_gating_func values
