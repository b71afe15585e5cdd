"""A constrained reply's token budget, kept closable (budget-aware closing).

A grammar that lets a reply stop anywhere is no guarantee once the reply has a token limit: cut at the
limit, a JSON reply ends inside a string. `ReplyBudget` keeps, beside the grammar processor, the closing
of the reply so far (engine.sampling.closing) and holds one invariant: the closing's tokens never exceed
the tokens left. Two levers keep it:

- a token the sampler picks that would open more than the budget can close is refused (`vet`; the
  sampler then takes its next choice with the same draw), checked only near the end of the budget;
- when the closing takes every token left, those tokens are the reply's only choices (`forcing`), so they
  are a forced span, which speculation drafts whole.

A reply closed that way has `closed_early` set (finish reason "length_closed"). A budget below the
grammar's shortest document is refused before any token (ReplyBudgetTooSmall).
"""

from __future__ import annotations

import functools
from typing import Protocol, Sequence

from engine.errors import ReplyBudgetTooSmall
from engine.sampling.closing import Closer


class Spelling(Protocol):
    """What a budget reads of the grammar's vocabulary (engine.sampling.grammar.GrammarVocabulary)."""

    source: "_TokenBytes"

    def ids_of(self, text: bytes) -> list[int] | None:
        """The token ids that spell `text` exactly (None when none do)."""


class _TokenBytes(Protocol):
    tokens: Sequence[bytes]  # each token id's bytes

ZONE = 24  # tokens before the closing's length where picks start to be checked
REFUSALS = 8  # picks refused in one step before the reply closes instead
# bytes after which JSON's structure may have changed; a token without any leaves the closing as it was
_STRUCTURAL = frozenset(b'{}[],:"\\')


class ReplyBudget:
    def __init__(self, compiled: str, vocabulary: Spelling, tokens: int):
        self.vocabulary, self.limit = vocabulary, tokens
        self.spent = 0
        self.forced: list[int] = []  # the closing's tokens, once they are the only choice
        self.closed_early = False
        start, shortest = _start_of(compiled)
        self._twin = start.fork()
        self._keep(shortest)
        self._pending = None  # (token, twin, closing) of the last pick `vet` admitted
        self._refusals = 0
        # the largest growth of the closing in one token so far: the zone widens by it, so a token that
        # opens a large structure is checked before it is taken (this reply's own: a reply is a pure
        # function of its grammar, limit and draws)
        self._growth = 0
        self.minimal = None if self._closing is None else self._kept_tokens()
        if self.minimal is not None and self.minimal > tokens:
            raise ReplyBudgetTooSmall(
                f"the shortest reply this grammar allows takes {self.minimal} tokens, more than the reply's "
                f"limit of {tokens}: raise the limit to at least {self.minimal}")

    def clone(self) -> "ReplyBudget":
        twin = object.__new__(ReplyBudget)
        twin.__dict__.update(self.__dict__)
        twin.forced, twin._twin, twin._pending = list(self.forced), self._twin.fork(), None
        return twin

    @property
    def remaining(self) -> int:
        return self.limit - self.spent

    def _count(self, closing: bytes) -> int:
        ids = self.vocabulary.ids_of(closing)
        return len(closing) if ids is None else len(ids)

    def _keep(self, closing: bytes | None, tokens: int | None = None) -> None:
        """The closing kept for the reply so far (bytes; None: none within the walk's limits), and its
        tokens when known."""
        self._closing, self._closing_tokens = closing, tokens

    def _kept_tokens(self) -> int:
        """The kept closing's tokens, counted once per closing."""
        if self._closing_tokens is None:
            self._closing_tokens = self._count(self._closing)
        return self._closing_tokens

    def _zone(self) -> int:
        return ZONE + self._growth

    # -- the two levers -----------------------------------------------------------------------------
    def forcing(self) -> list[int]:
        """The closing's tokens when they must start now (empty while the reply is free)."""
        if self.forced or self._closing is None or self._kept_tokens() < self.remaining:
            return self.forced  # the kept closing still fits: no shorter one is needed yet
        shortest = self._shortest_now()
        if shortest is not None:
            closing, ids = shortest
            self._keep(closing, len(ids))
            if len(ids) >= self.remaining:
                self.forced, self.closed_early = ids, True
        return self.forced

    def _shortest_now(self) -> tuple[bytes, list[int]] | None:
        """The closing with the fewest tokens of the kept one (where it still completes the grammar) and a
        fresh walk (which may find a shorter way, or, its memo replaying another string's ending, a longer
        one), with its tokens."""
        candidates = [self._twin.closing()]
        if self._closing is not None and self._twin.completes(self._closing):
            candidates.append(self._closing)
        best = None
        for closing in candidates:
            ids = None if closing is None else self.vocabulary.ids_of(closing)
            if ids is not None and (best is None or len(ids) < len(best[1])):
                best = (closing, ids)
        return best

    def vet(self, token: int) -> int | None:
        """`token` when the reply may take it and still close within what is left after it; None when not;
        after REFUSALS refusals in one pick, the closing starts (its first token)."""
        if self.forced:
            return self.forced[0]
        if self._closing is None or not self._near():
            return token
        twin = self._twin.clone()
        if not twin.feed(self.vocabulary.source.tokens[token]):
            return token  # not a grammar token: the grammar's own mask rules it out
        data = self.vocabulary.source.tokens[token]
        closing = (self._closing[len(data):] if self._closing.startswith(data)  # along the kept closing
                   else self._closing if twin.completes(self._closing) else None)  # content: it still closes
        if closing is None or len(closing) > self.remaining - 1 and self._count(closing) > self.remaining - 1:
            closing = twin.closing()
        if closing is not None and self._count(closing) <= self.remaining - 1:
            self._pending, self._refusals = (token, twin, closing), 0
            return token
        self._refusals += 1
        if self._refusals < REFUSALS:
            return None
        self._refusals = 0
        shortest = self._shortest_now()
        if shortest is None or not shortest[1]:
            return None
        closing, ids = shortest
        self._keep(closing, len(ids))
        self.forced, self.closed_early = ids, True
        return ids[0]

    def _near(self) -> bool:
        """Within the zone before the budget's end where picks are checked: the kept closing's tokens, ZONE and
        the largest growth of the closing in one token so far, from the end."""
        return self.remaining <= self._kept_tokens() + self._zone()

    def commit(self, token: int) -> None:
        self.spent += 1
        data = self.vocabulary.source.tokens[token]
        if self.forced:
            if token == self.forced[0]:
                self.forced.pop(0)
                self._twin.feed(data)
                self._keep(self._closing[len(data):])
                return
            self.forced = []  # a caller that overrode the mask: find the closing again
        pending, self._pending = self._pending, None
        before = self._closing
        before_tokens = None if before is None else self._kept_tokens()
        if pending is not None and pending[0] == token:
            _, self._twin, closing = pending
            self._keep(closing)
        elif not self._twin.feed(data):
            self._keep(None)  # the grammar failed; the processor forces its stop
            return
        elif before is not None and before.startswith(data):
            self._keep(before[len(data):])  # the token went along the kept closing
        elif before is None or not (self._unchanged(data) or self._twin.completes(before)):
            self._keep(self._twin.closing())
        if before is not None and self._closing is not None and self._closing is not before:
            self._growth = max(self._growth, self._kept_tokens() - before_tokens)

    def _unchanged(self, data: bytes) -> bool:
        """Far from the end, a token without structure (a string's or a number's content) is taken to leave
        the closing as it was; near the end every token's effect is checked."""
        return not _STRUCTURAL.intersection(data) and not self._near()


@functools.lru_cache(maxsize=64)
def _start_of(compiled: str) -> tuple[Closer, bytes | None]:
    """A grammar's twin at its start (never advanced: replies clone it) and its shortest document, made once
    per grammar: a twin takes milliseconds to build and a walk through several formats tens of them, and
    every reply under the grammar starts there."""
    start = Closer(compiled)
    return start, start.closing()
