"""Lossless draft-free speculative decoding (spec 13.9).

Drafts come from deterministic indexes over text the model has already seen -- the conversation's own
suffix automaton, frozen reference documents, token recycling -- and a verify forward over
[last token, draft...] is sampled row by row with the plain sampler, so the committed stream is identical
to a plain run's. No draft model, no extra weights.
"""

from engine.speculative.cascade import AcceptanceGate, SpeculationIndex
from engine.speculative.constrained import ConstrainedSource, grammar_aware
from engine.speculative.decoder import SpecOptions, SpeculativeDecoder, Stats, StepResult
from engine.speculative.gate import CostGate, measure_verify_costs, table_cost
from engine.speculative.recycling import TokenRecycling
from engine.speculative.sam_index import Cursor, FrozenSource, SamIndex
from engine.speculative.source import DraftSource, TopKRow
from engine.speculative.stream import SpeculativeStream
from engine.speculative.target import CacheTarget, VerifyTarget

__all__ = ["AcceptanceGate", "CacheTarget", "ConstrainedSource", "CostGate", "Cursor", "DraftSource",
           "FrozenSource", "SamIndex", "SpecOptions", "SpeculationIndex", "SpeculativeDecoder",
           "SpeculativeStream", "Stats", "StepResult", "TokenRecycling", "TopKRow", "VerifyTarget",
           "grammar_aware", "measure_verify_costs", "table_cost"]
