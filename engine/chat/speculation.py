"""Speculative turns (spec 13.9): a conversation's reply decoded by the lossless speculative decoder.

The turn is the plain turn's: the same prefill, and the same sample / stop-check / commit steps (the
decoder calls them through `_TurnSampler`, `is_stop` and `sink`), so the committed tokens, the sampler's
RNG and processor state, the stop that ends the reply and the cache rows it leaves are those of a plain
turn. What differs is only how many tokens one forward checks: [last token, draft...] in one row-wise
verify, each row bitwise a one-token step.

Per conversation, across turns: the draft index (SpeculationIndex over the whole history, re-synced at
every turn start -- an extended history appends, a rewritten one (LCP reuse, an edit, a reopened chat)
rebuilds) and the cost gate, over the verify-cost table measured for the model on this machine.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from engine.speculative import CacheTarget, CostGate, SpecOptions, SpeculationIndex, SpeculativeDecoder
from engine.speculative.source import TopKRow
from engine.speculative.verify_costs import verify_cost_table

if TYPE_CHECKING:
    from engine.chat.conversation import _Turn


GATE_MIN_DRAFTED = 32


class Speculation:
    """A conversation's speculative state: the draft index over its history and the cost gate."""

    def __init__(self, model, options: SpecOptions | None = None):
        self.options = options or SpecOptions()
        # drafts shorter than the decoder's min_draft never reach a verify: they must not count as rejected
        self.index = SpeculationIndex(model.vocab_size, accounting_min_draft=self.options.min_draft)
        # the gate judges over about four drafts: one miss at a turn's start must not switch speculation
        # off for the next reprobe_after tokens
        self.gate = CostGate(verify_cost_table(model), max_draft=self.options.max_draft,
                             min_draft=self.options.min_draft, min_window_drafted=GATE_MIN_DRAFTED)

    def run(self, turn: "_Turn", logits: np.ndarray) -> Iterator[str]:
        """Decode the turn after its prefill (`logits`: the prefill's last row); yield its text per step."""
        c = turn.convo
        self.index.sync(c._history)
        decoder = SpeculativeDecoder(CacheTarget(c.model, c.cache), _TurnSampler(turn), _TurnBoundary(self.index, turn),
                                     vocab_size=c.model.vocab_size, options=self.options, gate=self.gate,
                                     clock=time.perf_counter)
        turn.stats.spec = decoder.stats
        pieces: list[str] = []
        stop = None

        def is_stop(token: int) -> bool:
            nonlocal stop
            stop = turn.stop_check(token)
            return stop is not None

        def sink(token: int) -> None:
            pieces.append(turn.commit(token))

        if turn.cancelled():
            yield turn.end("cancelled")
            return
        decoder.bootstrap(logits, c._history, is_stop=is_stop, sink=sink)
        while True:
            text = "".join(pieces)
            pieces.clear()
            if stop is not None:
                text += turn.end(stop[0], fired=stop[1])
            elif spent := turn.budget_spent():
                text += turn.end(spent)
            elif turn.cancelled():
                text += turn.end("cancelled")
            if text:
                yield text
            if turn.done:
                return
            decoder.step(c._history, limit=c.options.max_tokens - len(turn.ids), is_stop=is_stop, sink=sink)


class _TurnSampler:
    """The decoder's sampler: the turn's own sample step (the conversation's sampler, timed for the turn's
    statistics) over the history the decoder extends, which is the conversation's."""

    def __init__(self, turn: "_Turn"):
        self.turn = turn

    def sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        return self.turn.sample(logits)


class _TurnBoundary:
    """The turn-boundary gate: a draft is cut before the first token that would end the reply (a stop
    token, or one completing a stop sequence after the reply and the draft before it). Such a token is
    never committed, so verifying rows past it is wasted work; the index is told its draft was shortened."""

    def __init__(self, index: SpeculationIndex, turn: "_Turn"):
        self.index, self.turn = index, turn

    def suggest(self, context: Sequence[int], budget: int) -> list[int]:
        draft = self.index.suggest(context, budget)
        c = self.turn.convo
        reply = self.turn.reply
        for i, token in enumerate(draft):
            # a token the tokenizer lacks (a padded vocabulary) ends the draft too: it has no text to check
            if not 0 <= token < c.tokenizer.vocab_size or c._ending(reply, token) is not None:
                self.index.truncate_pending(i)
                return draft[:i]
            reply += c.tokenizer.token_bytes(token)
        return draft

    def observe(self, committed: Sequence[int]) -> None:
        self.index.observe(committed)

    def observe_top_k(self, rows: Sequence[TopKRow]) -> None:
        self.index.observe_top_k(rows)

    def truncate_pending(self, new_len: int) -> None:
        self.index.truncate_pending(new_len)
