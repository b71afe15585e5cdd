"""Suffix-automaton draft index over a token stream (spec 13.9.2).

`SamIndex` is an online suffix automaton: `append` extends it in O(1) amortized automaton work per token,
and after every append it knows the longest suffix of the stream that also occurs ending strictly before
the end (the self-excluded match: the current occurrence never matches itself) and where the most recent
such earlier occurrence ends. `draft` proposes the tokens that followed that occurrence.

The most recent occurrence is the largest end position of the match state, excluding the newest one. Every
position is owned by the state created when it was appended, and a state's end positions are those of the
states below it in the suffix-link tree, so "the most recent end of state q" is "the newest position
appended anywhere under q". Appending position i makes i the newest under every state on the new state's
suffix-link path; that path can be as long as the match (a stream of one repeated token makes it the whole
stream), so the stamp is written by a link-cut tree over the suffix-link tree: path-assign and point query
in O(log n) amortized, and edge splits (clones) as cut + link.

A failed append poisons the index: a half-applied automaton must never serve drafts, so every query answers
0 / no draft from then on and further appends raise. `freeze()` ends appends for a reference document and
fixes every state's most recent end position; external `Cursor`s then match any other stream against it
(before freezing, appends can split the state a cursor stands on).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Iterable, Sequence

from engine.errors import SamIndexError

MAX_STREAM_LEN = 1 << 29


@dataclass(frozen=True)
class Cursor:
    """A position of an external stream in a frozen index: the state of its longest suffix that occurs in
    the document, and that suffix's length."""
    state: int = 0
    len: int = 0


class SamIndex:
    def __init__(self, *, min_match: int = 2, max_draft: int = 16):
        self.min_match = min_match  # shorter matches draft nothing
        self.max_draft = max_draft
        self.tokens: list[int] = []
        self._poisoned = False
        self._frozen = False
        # automaton: state 0 is the root (the empty string)
        self._next: list[dict[int, int]] = [{}]
        self._link = [-1]
        self._length = [0]
        self._last = 0
        self._match_state = 0  # suffix link of the newest state: the self-excluded longest match
        self._match_end = -1   # most recent end position of that match before the newest position
        # link-cut tree over the suffix links; _stamp is the newest position under a state
        self._left = [-1]
        self._right = [-1]
        self._up = [-1]     # splay parent, or the path-parent when the node is a splay root
        self._stamp = [-1]
        self._lazy = [-1]   # a stamp still to be pushed into both splay children
        self._recent: list[int] | None = None  # frozen: every state's most recent end position

    # --- queries -------------------------------------------------------------------------------------

    @property
    def poisoned(self) -> bool:
        return self._poisoned

    @property
    def frozen(self) -> bool:
        return self._frozen

    def token_count(self) -> int:
        return 0 if self._poisoned else len(self.tokens)

    def match_len(self) -> int:
        """Length of the longest suffix of the stream that also ends at an earlier position."""
        return 0 if self._poisoned else self._length[self._match_state]

    def match_end(self) -> int:
        """End position of the most recent earlier occurrence of that suffix (-1 with no match)."""
        return -1 if self._poisoned or self._match_state == 0 else self._match_end

    def draft(self, budget: int | None = None) -> list[int]:
        """The tokens that followed the most recent earlier occurrence of the match (at most `budget` and
        max_draft of them); empty below min_match."""
        if self.match_len() < max(self.min_match, 1):
            return []
        n = self.max_draft if budget is None else min(budget, self.max_draft)
        start = self._match_end + 1
        return self.tokens[start:start + max(n, 0)]

    # --- appends -------------------------------------------------------------------------------------

    def append(self, new_tokens: Iterable[int]) -> None:
        """Extend the stream. Raises SamIndexError when frozen (nothing changes) or when the append fails
        (the index is then poisoned)."""
        if self._poisoned:
            raise SamIndexError("the suffix index was poisoned by a failed append and takes no more tokens")
        if self._frozen:
            raise SamIndexError("the suffix index is frozen (a reference document); it takes no appends")
        try:
            for token in new_tokens:
                self._append_one(_token_id(token))
        except BaseException as e:
            self._poisoned = True
            if isinstance(e, SamIndexError):
                raise
            raise SamIndexError(f"append to the suffix index failed ({e!r}); the index is poisoned") from e

    def _append_one(self, c: int) -> None:
        i = len(self.tokens)
        if i >= MAX_STREAM_LEN:
            raise SamIndexError(f"the suffix index holds its maximum of {MAX_STREAM_LEN} tokens")
        nxt, link, length = self._next, self._link, self._length
        self.tokens.append(c)
        cur = self._new_state(length[self._last] + 1, {}, stamp=i)
        p = self._last
        while p != -1 and c not in nxt[p]:
            nxt[p][c] = cur
            p = link[p]
        if p == -1:
            link[cur] = 0
            match_end = -1
        else:
            q = nxt[p][c]
            if length[p] + 1 == length[q]:
                link[cur] = q
                match_end = self._query(q)
            else:  # split q: the clone takes the shorter strings, which now also end at i
                match_end = self._query(q)
                clone = self._new_state(length[p] + 1, nxt[q].copy(), stamp=match_end)
                parent = link[q]
                self._cut(q)
                self._up[clone] = parent
                self._up[q] = clone  # q is a splay root without a left child after the cut
                link[clone] = parent
                link[q] = clone
                link[cur] = clone
                while p != -1 and nxt[p].get(c) == q:
                    nxt[p][c] = clone
                    p = link[p]
        self._up[cur] = link[cur]
        self._assign_path(cur, i)
        self._last = cur
        self._match_state = link[cur]
        self._match_end = match_end

    def _new_state(self, length: int, transitions: dict[int, int], *, stamp: int) -> int:
        self._next.append(transitions)
        self._link.append(-1)
        self._length.append(length)
        self._left.append(-1)
        self._right.append(-1)
        self._up.append(-1)
        self._stamp.append(stamp)
        self._lazy.append(-1)
        return len(self._length) - 1

    # --- link-cut tree (path-assign, point query, cut) -------------------------------------------------

    def _rotate(self, x: int) -> None:
        left, right, up = self._left, self._right, self._up
        p = up[x]
        g = up[p]
        if left[p] == x:
            b = right[x]
            left[p] = b
            right[x] = p
        else:
            b = left[x]
            right[p] = b
            left[x] = p
        if b >= 0:
            up[b] = p
        if g >= 0:
            if left[g] == p:
                left[g] = x
            elif right[g] == p:
                right[g] = x
        up[x] = g
        up[p] = x

    def _splay(self, x: int) -> None:
        """Rotate x to the root of its splay tree (the hot path: helpers inlined)."""
        left, right, up, stamp, lazy = self._left, self._right, self._up, self._stamp, self._lazy
        chain = [x]  # x and its splay ancestors: their pending stamps go down first
        y = x
        while True:
            p = up[y]
            if p < 0 or (left[p] != y and right[p] != y):
                break
            chain.append(p)
            y = p
        for y in reversed(chain):
            t = lazy[y]
            if t >= 0:
                c = left[y]
                if c >= 0:
                    stamp[c] = lazy[c] = t
                c = right[y]
                if c >= 0:
                    stamp[c] = lazy[c] = t
                lazy[y] = -1
        rotate = self._rotate
        while True:
            p = up[x]
            if p < 0 or (left[p] != x and right[p] != x):
                break
            g = up[p]
            if g >= 0 and (left[g] == p or right[g] == p):
                rotate(p if (left[g] == p) == (left[p] == x) else x)
            rotate(x)

    def _access(self, x: int) -> None:
        """Make the root..x path one splay tree, rooted at x."""
        last, y = -1, x
        while y >= 0:
            self._splay(y)
            self._right[y] = last
            last, y = y, self._up[y]
        self._splay(x)

    def _assign_path(self, x: int, stamp: int) -> None:
        self._access(x)
        self._stamp[x] = stamp
        self._lazy[x] = stamp

    def _query(self, x: int) -> int:
        self._splay(x)
        return self._stamp[x]

    def _cut(self, x: int) -> None:
        """Detach x from its suffix-link parent in the link-cut tree."""
        self._access(x)
        above = self._left[x]
        if above >= 0:
            self._up[above] = -1
            self._left[x] = -1

    # --- frozen mode ---------------------------------------------------------------------------------

    def freeze(self) -> None:
        """End appends; every state's most recent end position becomes a plain lookup for cursors."""
        if self._frozen:
            return
        self._frozen = True
        if self._poisoned:
            return
        recent = [self._query(x) for x in range(len(self._length))]
        self._recent = recent
        self._left = self._right = self._up = self._stamp = self._lazy = []

    def advance(self, cursor: Cursor, token: int) -> Cursor:
        """The cursor after the external stream takes `token`."""
        if self._poisoned or not self._frozen:
            if self._poisoned:
                return Cursor()
            raise SamIndexError("freeze() the suffix index before matching an external stream against it")
        nxt, link, length = self._next, self._link, self._length
        state, n = cursor.state, cursor.len
        while state and token not in nxt[state]:
            state = link[state]
            n = length[state]
        if token in nxt[state]:
            return Cursor(nxt[state][token], n + 1)
        return Cursor()

    def draft_from(self, cursor: Cursor, budget: int | None = None) -> list[int]:
        """The tokens that followed the most recent occurrence, in the document, of the cursor's match."""
        if self._poisoned or self._recent is None or cursor.len < max(self.min_match, 1):
            return []
        n = self.max_draft if budget is None else min(budget, self.max_draft)
        start = self._recent[cursor.state] + 1
        return self.tokens[start:start + max(n, 0)]

    # --- DraftSource (the conversation's own stream) -------------------------------------------------

    def suggest(self, context: Sequence[int], budget: int) -> list[int]:
        return self.draft(budget)

    def observe(self, committed: Sequence[int]) -> None:
        """Append; a failure degrades the index to 'no drafts' instead of failing the decode step."""
        try:
            self.append(committed)
        except SamIndexError:
            pass


class FrozenSource:
    """A DraftSource over one frozen reference document: a per-conversation cursor, the index borrowed."""

    def __init__(self, index: SamIndex, stream: Iterable[int] = ()):
        if not index.frozen:
            raise SamIndexError("a reference source needs a frozen suffix index (call freeze() first)")
        self.index = index
        self.cursor = Cursor()
        self.observe(stream)

    def match_len(self) -> int:
        return self.cursor.len

    def draft(self, budget: int | None = None) -> list[int]:
        return self.index.draft_from(self.cursor, budget)

    def suggest(self, context: Sequence[int], budget: int) -> list[int]:
        return self.draft(budget)

    def observe(self, committed: Iterable[int]) -> None:
        cursor, advance = self.cursor, self.index.advance
        for token in committed:
            cursor = advance(cursor, token)
        self.cursor = cursor


def _token_id(token) -> int:
    t = operator.index(token)
    if t < 0:
        raise ValueError(f"token ids are non-negative, got {t}")
    return t
