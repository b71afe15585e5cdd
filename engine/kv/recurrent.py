"""A hybrid model's memory (Qwen3.5): KV rows for its attention layers and a recurrent state for its Gated
DeltaNet layers (a kernels.backend StateStore), behind the Memory protocol (engine.kv.memory).

The state holds every position it has read at once, so it can only go back to where a copy of it was kept:
- marks: copies at the positions the conversation asks for (`mark()`: a turn's end, a prompt before its
  last token), the newest MAX_MARKS kept: a re-rendered history, an edit or a regenerated reply rewinds to
  the last mark at or before where it differs and reads from there;
- row states: a row-wise feed of 2..KEEP_ROWS_MAX rows (a speculative verify) keeps the state after each
  row, so the rejected rows roll back exactly, to the bits a one-token decode leaves.
Positions it can be cut to: 0, its length, a mark, a row of the last feed.
"""

from __future__ import annotations

from typing import Sequence

from engine.kv.cache import KvCache, KvDtype
from kernels.backend import Backend

MAX_MARKS = 6  # a state copy each: 63 MB for Qwen3.5-35B-A3B's 30 DeltaNet layers, 19 MB for its 0.8B
KEEP_ROWS_MAX = 16  # a verify's rows are fewer; longer row-wise feeds (scoring) keep no row states


class HybridCache(KvCache):
    persistable = True  # KV records and, beside them, state checkpoints at turn ends (engine.kv.state_persist)
    composable = False  # a state cannot follow another document's: one cartridge, a snapshot, starts it

    def __init__(self, kv_heads: Sequence[int], head_dims: Sequence[int], capacity: int,
                 dtype: KvDtype | str, backend: Backend, value_is_key: Sequence[bool],
                 state_shapes: Sequence[tuple[tuple[int, int], tuple[int, int, int]]]):
        super().__init__(kv_heads, head_dims, capacity, dtype, backend, value_is_key)
        self.state_shapes = tuple(state_shapes)
        self.state_store = self.backend.state_store(self.state_shapes)
        self._marks: dict[int, object] = {}
        self._rows: tuple[int, int] = (0, 0)  # the last feed's rows whose states are kept: [start, end)

    def feeding(self, m: int, row_wise: bool) -> None:
        keep = row_wise and 1 < m <= KEEP_ROWS_MAX
        self.state_store.keep_rows(keep)
        self._rows = (self.len, self.len + m) if keep else (0, 0)

    def mark(self) -> None:
        if self.len in self._marks or self.len == 0:
            return
        self._marks[self.len] = self.state_store.save()
        for old in sorted(self._marks)[:-MAX_MARKS]:
            del self._marks[old]

    def marks(self) -> list[int]:
        return sorted(self._marks)

    def truncation_point(self, n: int) -> int:
        n = min(n, self.len)
        start, end = self._rows
        if n == self.len or n == 0 or start < n <= end:
            return n
        return max((p for p in self._marks if p <= n), default=0)

    def can_truncate(self, n: int) -> bool:
        return n >= self.len or self.truncation_point(n) == n

    def truncate(self, n: int) -> None:
        if n >= self.len:
            return
        n = max(0, int(n))
        state = self._state_at(n)
        if state is None:
            self.state_store.zero()
        else:
            self.state_store.load(state)
        self._forget_after(n)

    def _state_at(self, n: int):
        """The state after n positions (n < len: a mark or a row of the last feed; len: the live one), as a
        save() of it; None for n = 0 (the zero state). ValueError where it kept none."""
        start, end = self._rows
        if n == 0:
            return None
        if n >= self.len:
            return self.state_store.save()
        if start < n <= end:
            return self.state_store.row_state(n - start - 1)
        if n in self._marks:
            return self._marks[n]
        raise ValueError(f"this memory cannot be cut to {n} positions (it can to {self.truncation_point(n)})")

    def saved_marks(self, count: int = 2) -> list[tuple[int, object]]:
        """The newest `count` marks as (position, state): what a sidecar keeps (engine.kv.state_persist)."""
        return [(p, self._marks[p]) for p in sorted(self._marks)[-count:]]

    def resume(self, checkpoints: Sequence[tuple[int, object]]) -> None:
        """Hold the KV rows loaded into it up to the newest of these saved (position, state) checkpoints, in
        that state, each of them a mark."""
        n = max(p for p, _ in checkpoints)
        if n > self.len:
            raise ValueError(f"a state at position {n} resumed over {self.len} loaded positions")
        self.state_store.load(dict(checkpoints)[n])
        self._forget_after(n)
        self._marks = {p: state for p, state in checkpoints if p > 0}

    def _forget_after(self, n: int) -> None:
        self.len = n
        self._marks = {p: s for p, s in self._marks.items() if p <= n}
        self._rows = (0, 0)
        self.state_store.keep_rows(False)

    def reset(self) -> None:
        self.state_store.zero()
        self._forget_after(0)

    def checkpoint(self) -> tuple[int, object, dict]:
        # a mark here is that state already (marks are only copied from): a reopened chat's turn end
        state = self._marks[self.len] if self.len in self._marks else self.state_store.save()
        return self.len, state, dict(self._marks)

    def restore(self, checkpoint: tuple[int, object, dict]) -> None:
        n, state, marks = checkpoint
        self.state_store.load(state)
        self._forget_after(n)
        self._marks = marks

    def copy_prefix(self, src: "HybridCache", n: int) -> None:
        if src.state_shapes != self.state_shapes:
            raise ValueError("copy_prefix between hybrid memories of different state shapes")
        state = src._state_at(min(n, src.len))  # ValueError where it cannot give its first n positions alone
        self.reset()
        self.copy_rows(src, 0, n)
        if state is not None:
            self.state_store.load(state)
        self._marks = {p: s for p, s in src._marks.items() if p <= n}

    def byte_size(self) -> int:
        return super().byte_size() + self.state_store.nbytes() * (1 + len(self._marks))
