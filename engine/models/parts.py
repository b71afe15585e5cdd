"""What a decoder layer is composed of, as protocols: a *mixer* (what mixes positions: attention today;
latent attention or a recurrent state later) and a *feed-forward* part (a gated MLP today; experts later).

A family file reads GGUF metadata into each layer's part args (engine.models.block.LayerArgs); each kind
of args lists its tensors (engine.models.layout), checks its metadata, and builds its part, which runs on
the backend's ops and may offer the spec a backend's fused row-wise stack reads (None: it has none, and
the layer runs through the composed ops). A new kind of part is a new args class and its part: nothing
else names the kinds.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, Sequence

import numpy as np

from engine.gguf.reader import GGUFFile
from engine.models.layout import TensorSpec
from kernels.backend import Backend, Segment


class Mixer(Protocol):
    def __call__(self, h, segments: Sequence[Segment], positions: np.ndarray, row_wise: bool):
        """h [rows, n_embd] (normed) of every segment -> the mixer's output [rows, n_embd]; writes each
        segment's memory at its positions."""

    def spec(self) -> Any | None:
        """This part as the backend's fused row-wise stack reads it (kernels.backend), or None."""


class FeedForward(Protocol):
    def __call__(self, h, row_wise: bool):
        """h [rows, n_embd] (normed) -> [rows, n_embd]."""

    def spec(self) -> Any | None:
        """This part as the backend's fused row-wise stack reads it (kernels.backend), or None."""


class PartArgs(Protocol):
    OPS: tuple[str, ...]  # the backend ops the part runs on (kernels.backend's names)

    def tensors(self, p: str, n_embd: int) -> list[TensorSpec]:
        """The part's tensors in layer `p` ("blk.N.")."""

    @staticmethod
    def check_layers(arch: str, layers: Sequence[Any]) -> str | None:
        """The first kernel precondition the args of every layer with this kind of part break, or None."""


class MixerArgs(PartArgs, Protocol):
    MEMORY: str  # what it keeps per conversation: "kv" (rows, KvCache) or "state" (a recurrent state)
    VALUE_IS_KEY: bool  # "kv": the layer's cached V rows are its K rows (kept once)

    def kv_geometry(self) -> tuple[int, int]:
        """"kv": what the layer keeps per position in the KV cache: (kv heads, head size)."""

    def state_shape(self) -> tuple[tuple[int, int], tuple[int, int, int]]:
        """"state": its recurrent state's arrays (kernels.backend StateStore)."""

    def build(self, file: GGUFFile, p: str, layer: int, n_embd: int, eps: float, backend: Backend) -> Mixer:
        ...


class FeedForwardArgs(PartArgs, Protocol):
    def build(self, file: GGUFFile, p: str, layer: int, n_embd: int, backend: Backend) -> FeedForward:
        ...


def first_problem(checks: list[tuple[bool, str]]) -> str | None:
    return next((message for ok, message in checks if not ok), None)


def positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


def shown(values: list) -> str:
    """Per-layer values in a message: one value when every layer has it."""
    return str(values[0]) if len(set(values)) == 1 else str(values)
