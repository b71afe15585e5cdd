"""What the speculative decoder verifies against: a KV cache and a forward over token rows at its end.

`VerifyTarget` is the decoder's whole view of the model. Losslessness needs `verify` to return, for every
fed token, the logits row a one-token forward would have produced at that position (bitwise: the model's
row-wise path), and to leave the same KV rows behind for the positions the decoder keeps.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np


class VerifyTarget(Protocol):
    capacity: int  # positions the cache can hold

    def __len__(self) -> int:
        """Positions the cache holds now."""

    def verify(self, tokens: Sequence[int]) -> np.ndarray:
        """Feed `tokens` at the cache end; their logits, [len(tokens), vocab]."""

    def truncate(self, keep_len: int) -> None:
        """Keep the first keep_len positions (at or above the length: no-op)."""


class CacheTarget:
    """A model's row-wise forward over one KV cache (`model.forward_rows(tokens, cache)` -> [m, vocab])."""

    def __init__(self, model, cache):
        self.model = model
        self.cache = cache

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    def __len__(self) -> int:
        return self.cache.len

    def verify(self, tokens: Sequence[int]) -> np.ndarray:
        return self.model.forward_rows(list(tokens), self.cache)

    def truncate(self, keep_len: int) -> None:
        self.cache.truncate(keep_len)
