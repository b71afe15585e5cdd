"""The logit-processor seam (spec 13.6): a pre-sampling transform a Sampler runs on every row.

Grammar constraints, bias lists and banned-token rules plug in here. Because the seam lives inside the
Sampler, every decode path that samples through one (chat, batched decode, speculation) picks a processor
up without loop changes. One processor per decode stream, like the sampler that hosts it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import numpy as np


class LogitProcessor(ABC):
    """`process` edits one [vocab] logits row in place before the sampler's own chain (a mask writes -inf
    over forbidden tokens); `commit` observes the selected token, exactly once per `Sampler.sample`, on
    every path (greedy included), so the processor's state follows the history with no rollback hook."""

    closed_early = False  # the reply was closed to fit its token limit (set_budget)

    @abstractmethod
    def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
        """Mutate `logits` (float32, one row) in place; `history` is the stream's committed tokens."""

    @abstractmethod
    def commit(self, token: int) -> None:
        """The sampler chose `token`."""

    def reset(self) -> None:
        """Re-arm for a fresh constrained region; a Conversation calls it at every turn start."""

    def set_budget(self, tokens: int | None) -> None:
        """The reply after this reset may take at most `tokens` tokens (None: no limit); a Conversation calls
        it after `reset`. A processor whose replies must end as whole documents plans for it."""

    def vet(self, token: int) -> int | None:
        """The token to take for the sampler's pick `token` (after `process`): `token` when the processor
        admits it, None to refuse it (the sampler masks it and chooses again with the same draw, so a
        refusal costs no extra randomness), or the one token the processor now requires."""
        return token


class StructuredProcessor(LogitProcessor):
    """A processor that also exposes what its state machine knows beyond a mask. Both hooks must be
    deterministic pure lookaheads (they never change state); speculation turns them into drafts."""

    @abstractmethod
    def forced_tokens(self) -> list[int]:
        """The unique legal continuation from the current state (empty when there is a choice)."""

    @abstractmethod
    def valid_prefix_len(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of `tokens` the current state accepts."""


def has_structure(processor: LogitProcessor | None) -> bool:
    return isinstance(processor, StructuredProcessor)
