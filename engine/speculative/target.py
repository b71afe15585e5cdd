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
    """A model's row-wise forward over one conversation's memory (`model.forward_rows(tokens, cache)` ->
    [m, vocab]). A memory that cannot cut a verify's rejected rows (engine.kv.memory) goes back to where the
    verify began and is fed the kept tokens again, row-wise: the bits a one-token decode leaves."""

    def __init__(self, model, cache):
        self.model = model
        self.cache = cache
        self._verified: tuple[object, int, list[int]] | None = None  # the last verify: checkpoint, base, tokens

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    def __len__(self) -> int:
        return self.cache.len

    def verify(self, tokens: Sequence[int]) -> np.ndarray:
        self._verified = (self.cache.checkpoint(), self.cache.len, list(tokens))
        return self.model.forward_rows(list(tokens), self.cache)

    def truncate(self, keep_len: int) -> None:
        if keep_len >= self.cache.len or self.cache.can_truncate(keep_len):
            self.cache.truncate(keep_len)
            return
        if self._verified is None or keep_len < self._verified[1]:
            raise ValueError(f"this memory cannot rewind to {keep_len}, before the last verify began")
        checkpoint, base, tokens = self._verified
        self.cache.restore(checkpoint)
        if keep_len > base:
            self.model.forward_rows(tokens[: keep_len - base], self.cache)
