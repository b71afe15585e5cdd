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
from typing import TYPE_CHECKING

from engine.errors import ReplyBudgetTooSmall
from engine.sampling.closing import Closer

if TYPE_CHECKING:
    from engine.sampling.grammar import GrammarVocabulary

ZONE = 24  # tokens before the closing's length where picks start to be checked
REFUSALS = 8  # picks refused in one step before the reply closes instead
# bytes after which JSON's structure may have changed; a token without any leaves the closing as it was
_STRUCTURAL = frozenset(b'{}[],:"\\')


class ReplyBudget:
    def __init__(self, compiled: str, vocabulary: "GrammarVocabulary", tokens: int):
        self.vocabulary, self.limit = vocabulary, tokens
        self.spent = 0
        self.forced: list[int] = []  # the closing's tokens, once they are the only choice
        self.closed_early = False
        self._twin = Closer(compiled)
        self._closing = _shortest_document(compiled)  # bytes; None: no closing within the walk's limits
        self._pending = None  # (token, twin, closing) of the last pick `vet` admitted
        self._refusals = 0
        # the largest growth of the closing in one token so far: the zone widens to twice it, so a token
        # that opens a large structure is checked before it is taken (this reply's own: a reply is a pure
        # function of its grammar, limit and draws)
        self._growth = 0
        self.minimal = None if self._closing is None else self._count(self._closing)
        if self.minimal is not None and self.minimal > tokens:
            raise ReplyBudgetTooSmall(
                f"the shortest reply this grammar allows takes {self.minimal} tokens, more than the reply's "
                f"limit of {tokens}: raise the limit to at least {self.minimal}")

    def clone(self) -> "ReplyBudget":
        twin = object.__new__(ReplyBudget)
        twin.__dict__.update(self.__dict__)
        twin.forced, twin._twin, twin._pending = list(self.forced), self._twin.clone(), None
        return twin

    @property
    def remaining(self) -> int:
        return self.limit - self.spent

    def _count(self, closing: bytes) -> int:
        ids = self.vocabulary.ids_of(closing)
        return len(closing) if ids is None else len(ids)

    def _zone(self) -> int:
        return ZONE + 2 * self._growth

    # -- the two levers -----------------------------------------------------------------------------
    def forcing(self) -> list[int]:
        """The closing's tokens when they must start now (empty while the reply is free)."""
        if self.forced or self._closing is None or len(self._closing) < self.remaining:
            return self.forced  # a closing of n bytes takes at most n tokens
        if self._count(self._closing) < self.remaining:
            return self.forced  # the kept closing still fits: no shorter one is needed yet
        closing = self._twin.closing()  # afresh: the kept one may be longer than needed
        ids = None if closing is None else self.vocabulary.ids_of(closing)
        if ids and len(ids) >= self.remaining:
            self.forced, self.closed_early = ids, True
        if closing is not None:
            self._closing = closing
        return self.forced

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
                   else self._closing if _closes(twin, self._closing) else None)  # content: it still closes
        if closing is None or self._count(closing) > self.remaining - 1:
            closing = twin.closing()
        if closing is not None and self._count(closing) <= self.remaining - 1:
            self._pending, self._refusals = (token, twin, closing), 0
            return token
        self._refusals += 1
        if self._refusals < REFUSALS:
            return None
        self._refusals = 0
        closing = self._twin.closing()
        ids = None if closing is None else self.vocabulary.ids_of(closing)
        if not ids:
            return None
        self.forced, self._closing, self.closed_early = ids, closing, True
        return ids[0]

    def _near(self) -> bool:
        """Within the zone before the budget's end where picks are checked (the kept closing's bytes bound
        its tokens)."""
        return self.remaining <= len(self._closing) + self._zone()

    def commit(self, token: int) -> None:
        self.spent += 1
        data = self.vocabulary.source.tokens[token]
        if self.forced:
            if token == self.forced[0]:
                self.forced.pop(0)
                self._twin.feed(data)
                self._closing = self._closing[len(data):]
                return
            self.forced = []  # a caller that overrode the mask: find the closing again
        pending, self._pending = self._pending, None
        before = self._closing
        if pending is not None and pending[0] == token:
            _, self._twin, self._closing = pending
        elif not self._twin.feed(data):
            self._closing = None  # the grammar failed; the processor forces its stop
            return
        elif before is None or not (self._unchanged(data) or self._still_closes(before)):
            self._closing = self._twin.closing()
        if before is not None and self._closing is not None:
            self._growth = max(self._growth, len(self._closing) - len(before))

    def _unchanged(self, data: bytes) -> bool:
        """Far from the end, a token without structure (a string's or a number's content) is taken to leave
        the closing as it was; near the end every token's effect is checked."""
        return not _STRUCTURAL.intersection(data) and not self._near()

    def _still_closes(self, closing: bytes) -> bool:
        return _closes(self._twin, closing)


@functools.lru_cache(maxsize=64)
def _shortest_document(compiled: str) -> bytes | None:
    """The closing from a grammar's start, once per grammar (a walk through several formats takes tens of
    milliseconds, and every reply under the grammar starts there)."""
    return Closer(compiled).closing()


def _closes(twin: Closer, closing: bytes) -> bool:
    """Whether `closing` completes the grammar from `twin`'s state (which stays as it is)."""
    trial = twin.clone()
    return trial.feed(closing) and trial.done
