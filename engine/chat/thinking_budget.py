"""A thinking budget: a reply's reasoning is closed after N tokens of it, by forcing its closing marker.

A logit processor, so every decode path that samples through the conversation's sampler (plain, batched,
speculative) honours it without loop changes. It follows the reply's committed tokens with its own
ReasoningSplitter (on the tokens' bytes: every marker is ASCII, so a byte-per-character reading finds them),
counts the tokens committed inside the reasoning, and once `tokens` of them are committed while the reply
still reasons, the format's closer (`</think>`; harmony's end of analysis and start of the final message)
is the only choice, token by token. That closer is a forced span (`forced_tokens`), so speculation drafts
it whole and verifies it in one forward. A budget closes a reply's reasoning once; what the model writes
after it is up to the model (and the processor inside, `inner`, when there is one).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from engine.chat.reasoning import ReasoningAware, ReasoningFormat, ReasoningSplitter
from engine.sampling.processor import LogitProcessor, has_structure
from engine.tokenize import Tokenizer


class ThinkingBudget(ReasoningAware):
    def __init__(self, fmt: ReasoningFormat, tokenizer: Tokenizer, tokens: int,
                 inner: LogitProcessor | None = None):
        self.format, self.limit, self.inner = fmt, tokens, inner
        self.tokenizer = tokenizer
        self.closer = tokenizer.encode(fmt.closer, add_special=False)
        self.begin("")

    def begin(self, prompt_tail: str) -> None:
        if isinstance(self.inner, ReasoningAware):
            self.inner.begin(prompt_tail)
        self._tracker = ReasoningSplitter(self.format, prompt_tail)
        self.spent = 0  # tokens committed inside the reasoning
        self._forced: list[int] = []
        self._closed = False
        self._arm()

    def _arm(self) -> None:
        if not self._closed and self._tracker.in_reasoning and self.spent >= self.limit:
            self._forced, self._closed = list(self.closer), True

    # -- the processor seam ---------------------------------------------------------------------------
    @property
    def closed_early(self) -> bool:  # a grammar's, not the reasoning's
        return self.inner is not None and self.inner.closed_early

    def reset(self) -> None:
        if self.inner is not None:
            self.inner.reset()
        self.begin("")  # the turn begins it again where its prompt leaves the reply

    def set_budget(self, tokens: int | None) -> None:
        if self.inner is not None:
            self.inner.set_budget(tokens)

    def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
        if self.inner is not None:
            self.inner.process(logits, history)
        if self._forced:
            logits[:] = -np.inf
            logits[self._forced[0]] = 0.0

    def vet(self, token: int) -> int | None:
        if self._forced:
            return self._forced[0]
        return token if self.inner is None else self.inner.vet(token)

    def commit(self, token: int) -> None:
        if self.inner is not None:
            self.inner.commit(token)
        if self._forced and token == self._forced[0]:
            self._forced.pop(0)
        was = self._tracker.in_reasoning
        self._tracker.push(self.tokenizer.token_bytes(token).decode("latin-1"))
        if was and self._tracker.in_reasoning:
            self.spent += 1
        self._arm()

    def forced_tokens(self) -> list[int]:
        if self._forced:
            return list(self._forced)
        return self.inner.forced_tokens() if has_structure(self.inner) else []

    def valid_prefix_len(self, tokens: Sequence[int]) -> int:
        if self._forced:
            n = 0
            while n < min(len(tokens), len(self._forced)) and tokens[n] == self._forced[n]:
                n += 1
            return n
        valid = len(tokens)
        if self._tracker.in_reasoning and not self._closed:  # past the budget only the closer may follow
            valid = min(valid, self.limit - self.spent)
        return min(valid, self.inner.valid_prefix_len(tokens)) if has_structure(self.inner) else valid
