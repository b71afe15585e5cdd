"""Grammar-constrained drafting (spec 13.9.6): a grammar speeds speculation up instead of muting it.

`ConstrainedSource` wraps an inner DraftSource (the cascade) with the StructuredProcessor installed on the
stream's sampler, and reads only the processor's two lookaheads, which never change its state:

- a grammar-forced span (`forced_tokens`, JSON structure, a fixed literal) drafts itself: the verify row's
  mask allows the forced token, so the span is accepted unless the model spells the same bytes with other
  tokens. An inner draft that starts with the whole span, and goes on validly, is kept instead (it is longer);
- otherwise the inner draft is cut before its first token the grammar rejects (`valid_prefix_len`): that
  token's verify row would mask it, so verifying it and what follows is wasted work, and counting it would
  drag the inner source's acceptance gates down. The cut goes to the inner source's `truncate_pending`.

A forced span is marked `last_forced`, so the decoder verifies it even when it is a single token: JSON
structure is mostly one-token spans (`"`, `": "`, `, "`), each a near-certain extra token per verify.

Lossless: drafts never decide what is committed (the decoder samples every row through the processor).
Deterministic: both lookaheads are functions of the committed tokens.
"""

from __future__ import annotations

from typing import Sequence

from engine.sampling.processor import LogitProcessor, StructuredProcessor, has_structure
from engine.speculative.source import DraftSource, truncate_pending, wants_top_k
from engine.speculative.source import match_len as source_match_len


class ConstrainedSource:
    def __init__(self, processor: StructuredProcessor, inner: DraftSource):
        self.processor, self.inner = processor, inner
        self._from_inner = False  # the last suggestion is the inner source's (its truncations go there)
        self.last_forced = False  # the last suggestion is the grammar's forced span
        if wants_top_k(inner):  # only then: the decoder computes top-K for sources that take it
            self.observe_top_k = inner.observe_top_k

    def suggest(self, context: Sequence[int], budget: int) -> list[int]:
        self._from_inner = self.last_forced = False
        if budget <= 0:
            return []
        forced = list(self.processor.forced_tokens())[:budget]
        draft = list(self.inner.suggest(context, budget))
        valid = self.processor.valid_prefix_len(draft) if draft else 0
        if valid and valid >= len(forced) and draft[:len(forced)] == forced:
            if valid < len(draft):
                truncate_pending(self.inner, valid)
            self._from_inner = True
            return draft[:valid]
        if draft:
            truncate_pending(self.inner, 0)  # not verified: not the inner source's miss
        self.last_forced = bool(forced)
        return forced

    def match_len(self) -> int:
        return source_match_len(self.inner)

    def truncate_pending(self, new_len: int) -> None:
        if self._from_inner:  # a forced span has no accounting to shorten
            truncate_pending(self.inner, new_len)

    def observe(self, committed: Sequence[int]) -> None:
        self._from_inner = self.last_forced = False
        self.inner.observe(committed)


def grammar_aware(source: DraftSource, processor: LogitProcessor | None) -> DraftSource:
    """`source`, wrapped in a ConstrainedSource when the sampler's processor has structure."""
    return ConstrainedSource(processor, source) if has_structure(processor) else source
