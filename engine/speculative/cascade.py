"""The speculation cascade (spec 13.9.4): one DraftSource over every index the decoder can draft from.

Sources, in order: the conversation's own SamIndex over every observed token; any number of frozen
reference documents (`add_reference`, the seam attached documents use), each matched by its own cursor over
the same stream; the model's next-token-prediction layer where it has one (`next_token`,
engine.speculative.next_token); and token recycling as the fallback (it also consumes the verify top-K
feedback).

Policy: the source with the longest current match wins (ties toward the conversation, then the
first-added reference), drafting min(budget, beta * (1 + match)) tokens; matches shorter than min_match
fall back to the next-token layer's draft, then to the recycling top-1 chain (at most recycling_chain
tokens); nothing to say drafts nothing and the decoder takes a plain step. Each source has a rolling
acceptance gate over its last gate_window drafted tokens: below mute_acceptance it is muted for
mute_commits committed tokens, then re-probed with a fresh window. Muted sources keep observing, so they
are in step with the stream when they come back (the next-token layer keeps reading the model's rows).
Acceptance is settled at the suggest -> observe seam (the common prefix of the draft and the committed
tokens); drafts shorter than accounting_min_draft are never verified by the decoder, so they are not counted.

Deterministic: suggestions are a function of the observed stream, the references and the feedback (and
the next-token layer's, of the model's hidden states, themselves a function of the stream).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from engine.errors import InvalidSpeculationConfig
from engine.speculative.next_token import NextTokenDrafts
from engine.speculative.recycling import TokenRecycling
from engine.speculative.sam_index import FrozenSource, SamIndex
from engine.speculative.source import TopKRow

_UNBOUNDED = 1 << 30  # the SamIndex's own draft cap; the cascade's budget governs


class AcceptanceGate:
    """Rolling acceptance over a source's last `window` drafted tokens, muting the source when it is poor."""

    def __init__(self, window: int = 64, mute_below: float = 0.20, mute_commits: int = 128):
        self.window = window
        self.mute_below = mute_below
        self.mute_commits = mute_commits
        self._bits: deque[bool] = deque(maxlen=window)
        self._hits = 0
        self._muted_left = 0
        self.drafted = 0   # lifetime totals, for summaries
        self.accepted = 0
        self.mutes = 0

    @property
    def muted(self) -> bool:
        return self._muted_left > 0

    def rate(self) -> float | None:
        return self._hits / len(self._bits) if self._bits else None

    def record(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        for i in range(drafted):
            if len(self._bits) == self.window:
                self._hits -= self._bits[0]
            hit = i < accepted
            self._bits.append(hit)
            self._hits += hit
        if len(self._bits) == self.window and self._hits < self.mute_below * self.window:
            self._muted_left = self.mute_commits
            self.mutes += 1
            self._bits.clear()
            self._hits = 0

    def tick(self, committed: int) -> None:
        """`committed` tokens went by; a muted source comes back (with a fresh window) after mute_commits."""
        if self._muted_left:
            self._muted_left = max(0, self._muted_left - committed)


@dataclass
class _Reference:
    source: FrozenSource
    gate: AcceptanceGate


@dataclass(frozen=True)
class SourceStats:
    name: str
    drafted: int
    accepted: int
    mutes: int
    muted: bool
    seconds: float = 0.0  # time the source spent computing (the next-token layer's; the indexes' is negligible)


class SpeculationIndex:
    def __init__(self, vocab_size: int, *, beta: int = 2, min_match: int = 2, recycling_chain: int = 8,
                 recycling_k: int = 8, gate_window: int = 64, mute_acceptance: float = 0.20,
                 mute_commits: int = 128, accounting_min_draft: int = 2, next_token: NextTokenDrafts | None = None):
        if beta < 1 or min_match < 1 or recycling_chain < 0 or gate_window < 1 or mute_commits < 0:
            raise InvalidSpeculationConfig(
                f"speculation index: beta, min_match and gate_window must be >= 1 and recycling_chain, "
                f"mute_commits >= 0 (got {beta}, {min_match}, {gate_window}, {recycling_chain}, {mute_commits})")
        self.beta = beta
        self.min_match = min_match
        self.recycling_chain = recycling_chain
        self.accounting_min_draft = accounting_min_draft
        self._new_gate: Callable[[], AcceptanceGate] = lambda: AcceptanceGate(
            gate_window, mute_acceptance, mute_commits)
        self.conversation = self._new_stream()
        self.conversation_gate = self._new_gate()
        self.references: list[_Reference] = []
        self.next_token = next_token
        self.next_token_gate = self._new_gate()
        self.recycling = TokenRecycling(vocab_size, recycling_k)
        self.recycling_gate = self._new_gate()
        self._pending: tuple[AcceptanceGate, list[int]] | None = None

    def _new_stream(self) -> SamIndex:
        return SamIndex(min_match=self.min_match, max_draft=_UNBOUNDED)

    def _gates(self) -> list[AcceptanceGate]:
        return [self.conversation_gate, *(r.gate for r in self.references),
                *((self.next_token_gate,) if self.next_token is not None else ()), self.recycling_gate]

    # --- references ------------------------------------------------------------------------------

    def add_reference(self, tokens: Sequence[int]) -> None:
        """Index a document; its cursor catches up over the stream observed so far, so it can match the
        existing context at once. Bad tokens raise SamIndexError and add nothing."""
        index = SamIndex(min_match=self.min_match, max_draft=_UNBOUNDED)
        index.append(tokens)
        index.freeze()
        self.references.append(_Reference(FrozenSource(index, self.conversation.tokens), self._new_gate()))

    def clear_references(self) -> None:
        self.references.clear()
        self._pending = None

    # --- DraftSource -----------------------------------------------------------------------------

    def suggest(self, context: Sequence[int], budget: int) -> list[int]:
        self._pending = None
        if budget <= 0:
            return []
        candidates = []  # (match, order, draft(n), gate); order 0 is the conversation
        if not self.conversation_gate.muted:
            candidates.append((self.conversation.match_len(), 0, self.conversation.draft, self.conversation_gate))
        for order, ref in enumerate(self.references, 1):
            if not ref.gate.muted:
                candidates.append((ref.source.match_len(), order, ref.source.draft, ref.gate))
        candidates.sort(key=lambda c: (-c[0], c[1]))
        for match, _, draft, gate in candidates:
            if match < self.min_match:
                break
            tokens = draft(min(budget, self.beta * (1 + match)))
            if tokens:
                return self._propose(gate, tokens)
        if self.next_token is not None and not self.next_token_gate.muted:
            tokens = self.next_token.suggest(context, budget)
            if tokens:
                return self._propose(self.next_token_gate, tokens)
        if not self.recycling_gate.muted:
            tokens = self.recycling.suggest(context, min(budget, self.recycling_chain))
            if tokens:
                return self._propose(self.recycling_gate, tokens)
        return []

    def match_len(self) -> int:
        """The longest current match among the sources that may draft (the conversation, the references)."""
        matches = [self.conversation.match_len()] if not self.conversation_gate.muted else []
        matches += [ref.source.match_len() for ref in self.references if not ref.gate.muted]
        return max(matches, default=0)

    def _propose(self, gate: AcceptanceGate, tokens: list[int]) -> list[int]:
        self._pending = (gate, tokens)
        return list(tokens)

    def truncate_pending(self, new_len: int) -> None:
        if self._pending is not None:
            gate, tokens = self._pending
            self._pending = (gate, tokens[:max(new_len, 0)]) if new_len > 0 else None

    def observe(self, committed: Sequence[int]) -> None:
        pending, self._pending = self._pending, None
        self._extend(committed)  # first: the commits that settle a draft do not count toward its mute
        if self.next_token is not None:  # a decode step's commits (it follows a sync through the model's rows)
            self.next_token.observe(committed)
        if pending is not None:
            gate, draft = pending
            if len(draft) >= self.accounting_min_draft:
                gate.record(len(draft), _common_prefix_len(draft, committed))

    def observe_top_k(self, rows: Sequence[TopKRow]) -> None:
        self.recycling.observe_top_k(rows)

    def _extend(self, tokens: Sequence[int]) -> None:
        if not len(tokens):
            return
        self.conversation.observe(tokens)
        for ref in self.references:
            ref.source.observe(tokens)
        self.recycling.observe(tokens)
        for gate in self._gates():
            gate.tick(len(tokens))

    def sync(self, context: Sequence[int]) -> None:
        """Bring the index to `context` (the whole committed stream, e.g. after a new prompt was prefilled):
        append what it lacks, or rebuild the stream indexes when the context no longer extends what was
        observed (an edited or regenerated turn). Gates and the recycling matrix are kept."""
        self._pending = None
        seen = self.conversation.tokens
        if len(seen) <= len(context) and list(context[:len(seen)]) == seen and not self.conversation.poisoned:
            self._extend(context[len(seen):])
            return
        self.conversation = self._new_stream()
        self.conversation.observe(context)
        for ref in self.references:
            ref.source = FrozenSource(ref.source.index, context)
        self.recycling.reset_stream()
        self.recycling.observe(context[-1:])

    def source_stats(self) -> list[SourceStats]:
        names = ["conversation", *(f"reference {i}" for i in range(1, len(self.references) + 1)),
                 *(("next-token layer",) if self.next_token is not None else ()), "recycling"]
        seconds = {"next-token layer": self.next_token.seconds} if self.next_token is not None else {}
        return [SourceStats(n, g.drafted, g.accepted, g.mutes, g.muted, seconds.get(n, 0.0))
                for n, g in zip(names, self._gates())]


def _common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
