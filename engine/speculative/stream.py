"""One decode stream's speculative state over a model: the draft index and the cost gate.

Both outlive a single reply: the index holds everything the stream has seen (a conversation's history
across turns), the gate what speculation has been worth on this stream. `decoder` builds the per-reply
SpeculativeDecoder over a cache, with the verify-cost table measured for the model on this machine and
the wall clock rescaling it.
"""

from __future__ import annotations

import time

from engine.speculative.cascade import SpeculationIndex
from engine.speculative.decoder import SpecOptions, SpeculativeDecoder
from engine.speculative.gate import CostGate
from engine.speculative.next_token import NextTokenDrafts
from engine.speculative.source import DraftSource
from engine.speculative.target import CacheTarget
from engine.speculative.verify_costs import verify_cost_table

# The gate judges over at least three drafts (of its first budget, 3): a reply with nothing to copy must not
# pay for many misses before it is switched off, and one that turns to copying later speculates again on
# its long matches (CostGate.confident_match) whatever the gate decided at its start.
GATE_MIN_DRAFTED = 8


class SpeculativeStream:
    def __init__(self, model, options: SpecOptions | None = None, *, model_drafts: bool = True,
                 next_token: NextTokenDrafts | None = None):
        self.model = model
        self.options = options or SpecOptions()
        # the model's own next-token-prediction layer, where it has one (model_drafts: used; `next_token`: its
        # drafts, already following a conversation)
        self.next_token = (next_token or NextTokenDrafts.of(model)) if model_drafts else None
        # drafts shorter than the decoder's min_draft never reach a verify: they must not count as rejected
        self.index = SpeculationIndex(model.vocab_size, accounting_min_draft=self.options.min_draft,
                                      next_token=self.next_token)
        self.gate = CostGate(verify_cost_table(model), max_draft=self.options.max_draft,
                             min_draft=self.options.min_draft, min_window_drafted=GATE_MIN_DRAFTED)

    def decoder(self, cache, sampler, source: DraftSource | None = None) -> SpeculativeDecoder:
        """A decoder over `cache` drafting from `source` (default: the stream's index). The model's next-token
        layer follows `cache` from here on (its hidden states: the prefill before this call is not among
        them unless the cache was followed before)."""
        if self.next_token is not None:
            self.next_token.follow(cache)
        return SpeculativeDecoder(CacheTarget(self.model, cache), sampler, source or self.index,
                                  vocab_size=self.model.vocab_size, options=self.options, gate=self.gate,
                                  clock=time.perf_counter)
