"""A family the old switchboard could not express, landed as this one file: llama whose feed-forward, in
the layers that have one, adds a shared expert (a second gated MLP over the same input, its tensors named
ffn_*_shexp as llama.cpp names a shared expert's) to the layer's own MLP. The layers count their shared
expert's width in "<arch>.expert_shared_feed_forward_length", one per layer (0: none).

The part has no fused row-wise form: its layers run through the composed ops, the others through the
backend's fused stack (tests/engine/test_model_seam.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from engine.gguf.meta import meta_int, per_layer_int
from engine.gguf.reader import GGUFFile
from engine.models.args import ModelArgs, llama_like
from engine.models.feed_forward import GatedMlp, GatedMlpArgs
from engine.models.layout import TensorSpec
from engine.models.parts import first_problem
from kernels.backend import OP_ADD, Backend

ARCH = "llama-shexp"


@dataclass(frozen=True)
class SharedExpertMlpArgs:
    OPS = (*GatedMlpArgs.OPS, OP_ADD)
    own: GatedMlpArgs
    shared: GatedMlpArgs

    def tensors(self, p: str, n_embd: int) -> list[TensorSpec]:
        return self.own.tensors(p, n_embd) + self.shared.tensors(p, n_embd)

    def build(self, file: GGUFFile, p: str, layer: int, n_embd: int, backend: Backend) -> "SharedExpertMlp":
        return SharedExpertMlp(self.own.build(file, p, layer, n_embd, backend),
                               self.shared.build(file, p, layer, n_embd, backend))

    @staticmethod
    def check_layers(arch: str, layers: Sequence["SharedExpertMlpArgs"]) -> str | None:
        return first_problem([(all(f.shared.n_ff >= 1 for f in layers),
                               f"{arch}.expert_shared_feed_forward_length must be positive")])


class SharedExpertMlp:
    def __init__(self, own: GatedMlp, shared: GatedMlp):
        self.own, self.shared = own, shared

    def __call__(self, h, row_wise: bool):
        return self.own.backend.add(self.own(h, row_wise), self.shared(h, row_wise))

    def spec(self) -> None:
        return None  # no fused form: the backend's stack leaves this layer to the composed ops


def model_args(meta: Mapping) -> ModelArgs:
    args = llama_like(meta, ARCH, rope_neox=False)
    widths = per_layer_int(meta, f"{ARCH}.expert_shared_feed_forward_length", meta_int(meta, ARCH, "block_count"))
    args.layers = [layer if not width else replace(layer, feed_forward=SharedExpertMlpArgs(
                       layer.feed_forward, GatedMlpArgs(width, suffix="_shexp")))
                   for layer, width in zip(args.layers, widths)]
    return args
