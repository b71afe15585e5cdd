"""A response format on a reasoning model: the grammar holds the answer, and starts where the reasoning ends.

A grammar over the whole reply would hold the reasoning too: a JSON schema forbids `<think>`, and where the
template opens the reasoning in the prompt (the R1 distills) the JSON would be written as reasoning, leaving
the answer empty. `AnswerGrammar` wraps the grammar's processor and follows the reply with a
ReasoningSplitter:

- where the reply may still open its reasoning (Qwen3: right after the assistant's opener), its choices are
  the grammar's and the opening marker (when that is one token); any other token starts the answer;
- while the reply reasons, or writes a harmony header, the grammar sees no token and nothing is masked but
  the tokens that would end the reply where the grammar cannot end empty (a JSON document, a required tool
  call): a reply that must answer is not ended inside its reasoning (a thinking budget then closes it);
- once the answer starts, the grammar starts afresh, with the reply's token limit less what went before.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from engine.chat.reasoning import ReasoningAware, ReasoningFormat, ReasoningSplitter
from engine.sampling.processor import StructuredProcessor
from engine.tokenize import Tokenizer


class AnswerGrammar(ReasoningAware):
    def __init__(self, fmt: ReasoningFormat, tokenizer: Tokenizer, grammar: StructuredProcessor,
                 ends: frozenset[int] = frozenset()):
        """`ends`: the tokens that end the reply (its stop marker, every end-of-generation token)."""
        self.format, self.tokenizer, self.grammar, self.ends = fmt, tokenizer, grammar, ends
        self._unanswered: np.ndarray | None = None  # of `ends`, those the grammar refuses at its start
        opener = tokenizer.encode(fmt.opener, add_special=False)
        self._opener = opener[0] if len(opener) == 1 else None
        self._limit: int | None = None
        self.begin("")

    def begin(self, prompt_tail: str) -> None:
        self._tracker = ReasoningSplitter(self.format, prompt_tail)
        self._before = 0  # tokens of the reply before its answer
        # a reply that can open its reasoning only with several tokens is held to the grammar from the start
        self._answering = self._tracker.answering or (self._tracker.may_open and self._opener is None)

    # -- the processor seam ---------------------------------------------------------------------------
    @property
    def closed_early(self) -> bool:
        return self.grammar.closed_early

    def reset(self) -> None:
        self.grammar.reset()
        self.begin("")  # the turn begins it again where its prompt leaves the reply

    def set_budget(self, tokens: int | None) -> None:
        self._limit = tokens
        self.grammar.set_budget(tokens)

    def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
        if self._answering:
            self.grammar.process(logits, history)
        elif self._tracker.may_open:  # the answer's first token, or the reasoning's opening marker
            opener = logits[self._opener]
            self.grammar.process(logits, history)
            logits[self._opener] = opener
        else:
            logits[self._refused_ends(logits.shape[0])] = -np.inf

    def vet(self, token: int) -> int | None:
        if self._answering or (self._tracker.may_open and token != self._opener):
            return self.grammar.vet(token)
        return None if token in self._refused_ends(self.tokenizer.vocab_size) else token

    def commit(self, token: int) -> None:
        if self._answering:
            self.grammar.commit(token)
            return
        if self._tracker.may_open and token != self._opener:  # the reply answers without reasoning
            self._answering = True
            self.grammar.commit(token)
            return
        self._before += 1
        self._tracker.push(self.tokenizer.token_bytes(token).decode("latin-1"))
        if self._tracker.answering:  # the reasoning closed: the grammar starts with what is left
            self._answering = True
            self.grammar.reset()
            self.grammar.set_budget(None if self._limit is None else max(self._limit - self._before, 1))

    def forced_tokens(self) -> list[int]:
        return self.grammar.forced_tokens() if self._answering else []

    def valid_prefix_len(self, tokens: Sequence[int]) -> int:
        if self._answering:
            return self.grammar.valid_prefix_len(tokens)
        if self._tracker.may_open:
            return 0
        refused = self._refused_ends(self.tokenizer.vocab_size)  # reasoning is free text but for these
        return next((i for i, token in enumerate(tokens) if token in refused), len(tokens))

    def _refused_ends(self, vocab: int) -> np.ndarray:
        """The end tokens the grammar refuses as an answer's first token (its start is the same every turn:
        the mask of a grammar that has seen no token, a pure lookup)."""
        if self._unanswered is None:
            start = np.zeros(vocab, dtype=np.float32)
            self.grammar.process(start, [])
            self._unanswered = np.array(sorted(t for t in self.ends if t < vocab and start[t] == -np.inf),
                                        dtype=np.int64)
        return self._unanswered
