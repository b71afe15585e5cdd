"""A conversation's recurrent state in host memory (the CPU backend's StateStore, kernels.backend): per
Gated DeltaNet layer a conv window [d_conv - 1, channels] and a delta-rule state [n_v, head, head], float32."""

from __future__ import annotations

from typing import Sequence

import numpy as np


class HostStateStore:
    def __init__(self, shapes: Sequence[tuple[tuple[int, int], tuple[int, int, int]]]):
        self.conv = [np.zeros(conv, np.float32) for conv, _ in shapes]
        self.ssm = [np.zeros(ssm, np.float32) for _, ssm in shapes]
        self._keep = False
        self._rows: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(shapes)  # per layer, the last feed's

    def save(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        return [c.copy() for c in self.conv], [s.copy() for s in self.ssm]

    def load(self, saved: tuple[list[np.ndarray], list[np.ndarray]]) -> None:
        for dst, src in zip(self.conv + self.ssm, saved[0] + saved[1]):
            dst[...] = src

    def zero(self) -> None:
        for a in self.conv + self.ssm:
            a[...] = 0

    def keep_rows(self, on: bool) -> None:
        self._keep = on
        self._rows = [None] * len(self.conv)

    def row_buffers(self, layer: int, m: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Where the op writes layer's state after each of the m rows it feeds (None: not kept)."""
        if not self._keep:
            return None
        buffers = (np.empty((m, *self.conv[layer].shape), np.float32),
                   np.empty((m, *self.ssm[layer].shape), np.float32))
        self._rows[layer] = buffers
        return buffers

    def row_state(self, i: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        if any(r is None or i >= len(r[0]) for r in self._rows):
            raise IndexError(f"no state kept after row {i} of the last feed")
        return [r[0][i] for r in self._rows], [r[1][i] for r in self._rows]

    def read(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        return self.conv[layer].copy(), self.ssm[layer].copy()

    def write(self, layer: int, conv: np.ndarray, ssm: np.ndarray) -> None:
        self.conv[layer][...] = conv
        self.ssm[layer][...] = ssm

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.conv + self.ssm)
