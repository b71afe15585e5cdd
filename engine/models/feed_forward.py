"""The gated feed-forward part: down(activation(gate(x)) * up(x)), SwiGLU or GeGLU (tanh)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from engine.gguf.reader import GGUFFile
from engine.gguf.weights import LinearGroup, LinearWeight
from engine.models.layout import TensorSpec, matrix
from engine.models.parts import first_problem
from kernels.backend import OP_GATED, OP_LINEAR, Backend, GatedMlpSpec

ACTIVATIONS = ("silu", "gelu")


@dataclass(frozen=True)
class GatedMlpArgs:
    OPS = (OP_LINEAR, OP_GATED)  # the backend ops the part runs on
    n_ff: int
    activation: str = "silu"  # or "gelu"
    suffix: str = ""  # of its tensors' names: ffn_gate{suffix}.weight ("_shexp": a shared expert's)

    def names(self, p: str) -> tuple[str, str, str]:
        return tuple(f"{p}ffn_{w}{self.suffix}.weight" for w in ("gate", "up", "down"))

    def tensors(self, p: str, n_embd: int) -> list[TensorSpec]:
        gate, up, down = self.names(p)
        return [matrix(gate, self.n_ff, n_embd), matrix(up, self.n_ff, n_embd), matrix(down, n_embd, self.n_ff)]

    def build(self, file: GGUFFile, p: str, layer: int, n_embd: int, backend: Backend) -> "GatedMlp":
        return GatedMlp(self, file, p, n_embd, backend)

    @staticmethod
    def check_layers(arch: str, layers: Sequence["GatedMlpArgs"]) -> str | None:
        return first_problem([
            (all(f.n_ff >= 1 for f in layers), f"{arch}.feed_forward_length must be positive"),
            (all(f.activation in ACTIVATIONS for f in layers), f"{arch}: an activation other than silu or gelu"),
        ])


class GatedMlp:
    def __init__(self, args: GatedMlpArgs, file: GGUFFile, p: str, n_embd: int, backend: Backend):
        self.backend = backend
        gate, up, down = args.names(p)
        self.gate_up = LinearGroup([LinearWeight.load(file, gate, args.n_ff, n_embd, backend),
                                    LinearWeight.load(file, up, args.n_ff, n_embd, backend)])
        self.down = LinearWeight.load(file, down, n_embd, args.n_ff, backend)
        self.activation = args.activation

    def __call__(self, h, row_wise: bool):
        gate, up = self.gate_up(h, row_wise)
        return self.down(self.backend.gated(self.activation, gate, up), row_wise)

    def spec(self) -> GatedMlpSpec:
        """This part as a backend's fused row-wise stack reads it."""
        return GatedMlpSpec(gate_up=tuple(w.handle for w in self.gate_up.parts), down=self.down.handle,
                            activation=self.activation)
