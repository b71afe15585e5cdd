"""Drafts from the model's own next-token-prediction layer (engine.models.next_token: GLM-4.5's MTP).

The layer's row at position p reads the model's final hidden state at p and token p + 1, and predicts token
p + 2. The model hands this source the hidden states of every row it feeds into the conversation's cache
(`follow(cache)` sets the cache's hidden_sink), with their tokens and positions; they wait here until the
layer has read them. The layer keeps a row per position it read, in its own cache and in order:
- `observe` (every committed token) feeds it the rows whose next token the cache holds, up to ROWS_PER_CALL
  of them (more, a prompt's, wait for the first draft: the reply's first token is not held up for them);
- `suggest` feeds the last one, whose next token is the last committed (the one the next verify feeds
  first), and reads its logits: their argmax is the draft's first token. Each further token (up to `depth`)
  feeds the layer the token it just drafted with the state that drafted it (the reference implementations'
  chaining on one layer); those rows are dropped after.
Rows the model feeds again (a rejected draft's, an edited history's) replace what they overwrite; positions
whose hidden states the model never computed here (rows read from a sidecar or a cartridge, rows past the
`MAX_PENDING` it keeps) leave a gap the layer's rows skip: its drafts are then poorer, never wrong (the
decoder verifies every token).

Deterministic: every row runs row-wise, so its bits do not depend on which call fed it.
"""

from __future__ import annotations

import bisect
import time
from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np

from engine.models.next_token import NextTokenPredictor

ROWS_PER_CALL = 64   # the layer's row-wise calls take at most this many rows (and `observe` reads no more)
MAX_PENDING = 4096   # hidden states kept for the layer to read (the oldest are dropped: a gap)


class NextTokenDrafts:
    def __init__(self, predictor: NextTokenPredictor, depth: int = 3):
        if depth < 1:
            raise ValueError(f"a next-token draft needs depth >= 1, got {depth}")
        self.predictor = predictor
        self.depth = depth
        self.seconds = 0.0  # spent running the layer (what drafting from it costs beside the verifies)
        self._main = None   # the conversation's cache this source follows
        self._reset()

    @classmethod
    def of(cls, model) -> "NextTokenDrafts | None":
        """Drafts from `model`'s next-token-prediction layer; None where it has none."""
        predictor = getattr(model, "next_token", None)
        return cls(predictor) if predictor is not None else None

    def _reset(self) -> None:
        self._cache = None                  # the layer's own rows, made to the followed cache's size
        self._row_pos: list[int] = []       # the model position each of its rows predicts from
        self._row_next: list[int] = []      # and the token it joined
        self._last_state: np.ndarray | None = None  # the output state of the last row (at _row_pos[-1])
        self._pos0 = 0                      # hidden states the layer has not read: positions _pos0..
        self._tokens: list[int] = []        # the tokens the model fed there
        self._hidden = np.zeros((0, self.predictor.n_embd), np.float32)

    @property
    def positions_read(self) -> range:
        """The span of model positions the layer has rows for, from the first to the last (a gap inside counts)."""
        return range(self._row_pos[0], self._row_pos[-1] + 1) if self._row_pos else range(0)

    # --- following a conversation ---------------------------------------------------------------

    def follow(self, cache) -> None:
        """Draft for the conversation in `cache`: the model hands its hidden states here from now on."""
        if cache is self._main:
            return
        if self._main is not None and self._main.hidden_sink == self._on_hidden:
            self._main.hidden_sink = None
        self._main = cache
        self._reset()
        cache.hidden_sink = self._on_hidden

    def _on_hidden(self, pos0: int, tokens: list[int], hidden: np.ndarray) -> None:
        self._forget_from(pos0, tokens[0])
        end = self._pos0 + len(self._tokens)
        if self._tokens and self._pos0 <= pos0 <= end:
            keep = pos0 - self._pos0
            self._tokens = self._tokens[:keep] + list(tokens)
            self._hidden = np.concatenate([self._hidden[:keep], hidden])
        else:
            self._pos0, self._tokens, self._hidden = pos0, list(tokens), np.array(hidden, np.float32)
        if len(self._tokens) > MAX_PENDING:
            self._drop_pending(len(self._tokens) - MAX_PENDING)

    def _forget_from(self, pos: int, token: int) -> None:
        """The model fed position `pos` (token `token`) again: the layer's rows from there are stale, and the
        one before it too where it joined another token."""
        keep = bisect.bisect_left(self._row_pos, pos)
        if keep and self._row_pos[keep - 1] == pos - 1 and self._row_next[keep - 1] != token:
            keep -= 1
        if keep < len(self._row_pos):
            del self._row_pos[keep:], self._row_next[keep:]
            self._cache.truncate(keep)
            self._last_state = None

    def _drop_pending(self, n: int) -> None:
        self._pos0 += n
        self._tokens = self._tokens[n:]
        self._hidden = self._hidden[n:]

    # --- feeding the layer ----------------------------------------------------------------------

    def _first_unread(self) -> int:
        """The first position the layer has not read, past any gap before the hidden states kept here."""
        return max(self._row_pos[-1] + 1 if self._row_pos else self._pos0, self._pos0)

    def _read_up_to(self, end: int, last_next: int | None = None) -> bool:
        """Feed the layer the rows of the positions before `end` it has not read: each joins the token the model
        fed after it, or, for position end - 1, `last_next` (the last committed token, not fed yet). Whether
        its last row is now at end - 1."""
        first = self._first_unread()
        self._drop_pending(first - self._pos0)
        known_end = self._pos0 + len(self._tokens)  # hidden states known before here
        if last_next is not None and known_end >= end:
            stop, nexts = end, self._tokens[1: end - first] + [last_next]
        else:
            stop = min(end, known_end - 1)
            nexts = self._tokens[1: stop - first + 1]
        if stop > first:
            self._feed(first, nexts, self._hidden[: stop - first])
            self._drop_pending(stop - first)
        return bool(self._row_pos) and self._row_pos[-1] == end - 1

    def _feed(self, first: int, nexts: list[int], hidden: np.ndarray) -> None:
        if self._cache is None:
            self._cache = self.predictor.new_cache(self._main.capacity + self.depth)
        for s in range(0, len(nexts), ROWS_PER_CALL):
            states = self.predictor.forward(nexts[s: s + ROWS_PER_CALL], hidden[s: s + ROWS_PER_CALL], self._cache,
                                            first_is_position_0=first + s == 0)
            self._last_state = states[-1]
        self._row_pos += range(first, first + len(nexts))
        self._row_next += nexts

    # --- DraftSource ------------------------------------------------------------------------------

    @contextmanager
    def _timed(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - start

    def suggest(self, context: Sequence[int], budget: int) -> list[int]:
        if budget <= 0 or self._main is None or not context or self._main.len == 0:
            return []
        with self._timed():
            return self._draft(context, budget)

    def _draft(self, context: Sequence[int], budget: int) -> list[int]:
        if not self._read_up_to(self._main.len, last_next=int(context[-1])) or self._last_state is None:
            return []
        p = self.predictor
        state = self._last_state[None]
        draft = [int(np.argmax(p.logits(state)[0]))]
        rows = self._cache.len
        while len(draft) < min(budget, self.depth) and self._cache.len < self._cache.capacity:
            state = p.forward(draft[-1:], state, self._cache)
            draft.append(int(np.argmax(p.logits(state)[0])))
        self._cache.truncate(rows)
        return draft

    def observe(self, committed: Sequence[int]) -> None:
        """After a decode step: feed the layer the rows whose next token the model's cache now holds."""
        if self._main is None or not len(committed):
            return
        if self._main.len - 1 - self._first_unread() <= ROWS_PER_CALL:
            with self._timed():
                self._read_up_to(self._main.len - 1)
