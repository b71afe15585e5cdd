"""Speculative turns (spec 13.9): a conversation's reply decoded by the lossless speculative decoder.

The turn is the plain turn's: the same prefill, and the same sample / stop-check / commit steps (the
decoder calls them through `_TurnSampler`, `is_stop` and `sink`), so the committed tokens, the sampler's
RNG and processor state, the stop that ends the reply and the cache rows it leaves are those of a plain
turn. What differs is only how many tokens one forward checks: [last token, draft...] in one row-wise
verify, each row bitwise a one-token step.

Per conversation, across turns, a SpeculativeStream: the draft index over the whole history, re-synced at
every turn start (an extended history appends; a rewritten one -- LCP reuse, an edit, a reopened chat --
rebuilds), and the cost gate over the verify-cost table measured for the model on this machine.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from engine.chat.turn import Turn
from engine.speculative.constrained import grammar_aware
from engine.speculative.source import DraftSource, last_forced, match_len, truncate_pending, wants_top_k
from engine.speculative.stream import SpeculativeStream


def run_speculative(turn: Turn, stream: SpeculativeStream, logits: np.ndarray) -> Iterator[str]:
    """Decode the turn after its prefill (`logits`: the prefill's last row); yield its pieces per step."""
    c = turn.convo
    stream.index.sync(c._history)
    # a grammar's processor drafts its forced spans and cuts drafts at its first invalid token (13.9.6)
    source = grammar_aware(stream.index, c.sampler.processor)
    decoder = stream.decoder(c.cache, _TurnSampler(turn), _TurnBoundary(source, turn))
    turn.stats.spec = decoder.stats
    stop = None

    def is_stop(token: int) -> bool:
        nonlocal stop
        stop = turn.stop_check(token)
        return stop is not None

    def sink(token: int) -> None:
        turn.commit(token)

    if turn.cancelled():
        turn.end("cancelled")
        return
    decoder.bootstrap(logits, c._history, is_stop=is_stop, sink=sink)
    while True:
        if stop is not None:
            turn.end(stop[0], fired=stop[1])
        elif spent := turn.budget_spent():
            turn.end(spent)
        elif turn.cancelled():
            turn.end("cancelled")
        yield from turn.take_pieces()
        if turn.done:
            return
        decoder.step(c._history, limit=c.options.max_tokens - len(turn.ids), is_stop=is_stop, sink=sink)


class _TurnSampler:
    """The decoder's sampler: the turn's own sample step (the conversation's sampler, timed for the turn's
    statistics) over the history the decoder extends, which is the conversation's."""

    def __init__(self, turn: Turn):
        self.turn = turn

    def sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        return self.turn.sample(logits)


class _TurnBoundary:
    """The turn-boundary gate: a draft is cut before the first token that would end the reply (a stop
    token, or one completing a stop sequence after the reply and the draft before it). Such a token is
    never committed, so verifying rows past it is wasted work; the source is told its draft was shortened."""

    def __init__(self, source: DraftSource, turn: Turn):
        self.source, self.turn = source, turn
        if wants_top_k(source):
            self.observe_top_k = source.observe_top_k
        # the stop-sequence check reads only the reply's last bytes: a sequence's length less one
        self._tail = max((len(s) for s in turn.convo._stop_sequences), default=1)

    def suggest(self, context: Sequence[int], budget: int) -> list[int]:
        draft = list(self.source.suggest(context, budget))
        c = self.turn.convo
        reply = self.turn.reply[-self._tail:]
        for i, token in enumerate(draft):
            # a token the tokenizer lacks (a padded vocabulary) ends the draft too: it has no text to check
            if not 0 <= token < c.tokenizer.vocab_size or c._ending(reply, token) is not None:
                truncate_pending(self.source, i)
                return draft[:i]
            reply += c.tokenizer.token_bytes(token)
        return draft

    @property
    def last_forced(self) -> bool:  # a cut forced span is still forced
        return last_forced(self.source)

    def match_len(self) -> int:
        return match_len(self.source)

    def observe(self, committed: Sequence[int]) -> None:
        self.source.observe(committed)

    def truncate_pending(self, new_len: int) -> None:
        truncate_pending(self.source, new_len)
