"""Token recycling (spec 13.9.3; Luo et al. 2024): the self-draft fallback when no exact match exists.

A vocab x K adjacency matrix: row t holds the most recent top-K next-token candidates seen at a verified
position whose input token was t. `draft_chain` walks the top-1 chain from the last token until an unseen
row or the budget stops it. Verify feedback (`observe_top_k`) overwrites whole rows; every committed bigram
(a, b) is promoted to slot 0 of row a, because what the model actually produced beats stale logits. Rows are
copied in, never retained. Deterministic: the matrix is a function of the observed stream and feedback.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from engine.errors import InvalidSpeculationConfig
from engine.speculative.source import TopKRow

UNSEEN = -1  # an empty slot


class TokenRecycling:
    def __init__(self, vocab_size: int, k: int = 8):
        if vocab_size < 1 or k < 1:
            raise InvalidSpeculationConfig(f"token recycling needs a vocabulary and K >= 1 "
                                           f"(got vocab {vocab_size}, K {k})")
        self.k = k
        self.vocab_size = vocab_size
        self._next = np.full((vocab_size, k), UNSEEN, dtype=np.int32)
        self._prev: int | None = None  # last observed token: the first half of the next bigram

    def _known(self, token: int) -> bool:
        return 0 <= token < self.vocab_size

    def topk_of(self, token: int) -> list[int]:
        if not self._known(token):
            return []
        row = self._next[token]
        return row[row != UNSEEN].tolist()

    def update(self, token: int, topk: Sequence[int]) -> None:
        """Row `token` becomes `topk` (best first; at most K kept, out-of-vocabulary ids dropped)."""
        if not self._known(token):
            return
        kept = [t for t in topk if self._known(t)][: self.k]
        row = self._next[token]
        row[:] = UNSEEN
        row[: len(kept)] = kept

    def draft_chain(self, last_token: int, budget: int) -> list[int]:
        out: list[int] = []
        t = last_token
        while len(out) < budget and self._known(t):
            t = int(self._next[t, 0])
            if t == UNSEEN:
                break
            out.append(t)
        return out

    def reset_stream(self) -> None:
        """Forget the last observed token (the stream was rebuilt); the matrix is kept."""
        self._prev = None

    def _promote(self, a: int, b: int) -> None:
        row = self._next[a]
        hits = np.flatnonzero(row == b)
        end = int(hits[0]) if hits.size else self.k - 1  # the slot b leaves (or the evicted last one)
        row[1:end + 1] = row[:end].copy()
        row[0] = b

    # --- DraftSource -----------------------------------------------------------------------------

    def suggest(self, context: Sequence[int], budget: int) -> list[int]:
        return self.draft_chain(int(context[-1]), budget) if len(context) else []

    def observe(self, committed: Sequence[int]) -> None:
        prev = self._prev
        for token in committed:
            token = int(token)
            if prev is not None and self._known(prev) and self._known(token):
                self._promote(prev, token)
            prev = token
        self._prev = prev

    def observe_top_k(self, rows: Sequence[TopKRow]) -> None:
        for row in rows:
            self.update(row.token, row.topk)

