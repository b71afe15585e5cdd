"""A reply that may call tools: free text until a call's opener, then the call grammar (engine.chat.tool_grammar).

`ToolCallConstraint` is a StructuredProcessor with four phases:

- free: the model writes what it likes. Where the opener is several tokens of text (a template without tool
  support, whose prompt describes Hermes calls), a token that would complete the opener and run on past it
  is masked, so a call always starts on a token boundary where the grammar can take over;
- opening (tool_choice `required` or a tool's name, at the reply's start): the opener is forced, a span
  speculation drafts whole;
- call: the call grammar's processor masks and forces (the JSON keys, the closer);
- after a call, free text again where the format allows more (Hermes), else the grammar's end, which only
  the stop (or the format's closing token, gpt-oss's <|call|>) can follow. A reply that must call (`after`)
  then either ends or opens another call, as OpenAI's replies with tool_choice `required` do.

Every decision is a function of the committed tokens, so speculative and plain replies agree.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from engine.chat.tool_format import ToolFormat
from engine.chat.tool_grammar import call_grammar
from engine.chat.tool_use import ToolUse
from engine.errors import ReplyBudgetTooSmall
from engine.sampling.grammar import grammar_processor
from engine.sampling.processor import StructuredProcessor
from engine.tokenize import Tokenizer

FREE, OPENING, CALL, AFTER = "free", "opening", "call", "after"


class ToolCallConstraint(StructuredProcessor):
    def __init__(self, fmt: ToolFormat, use: ToolUse, tokenizer: Tokenizer, stop_id: int):
        self.format, self.use, self.tokenizer, self.stop_id = fmt, use, tokenizer, stop_id
        # a call that ends the reply on a token of its own (gpt-oss's <|call|>): the reply stops there
        self.closing_id = tokenizer.token_id(fmt.closer) if fmt.ends_reply and fmt.closer else None
        self._call = grammar_processor(call_grammar(fmt, use.callable, tokenizer), tokenizer,
                                       stop_id if self.closing_id is None else self.closing_id)
        self._opener_ids = tokenizer.encode(fmt.opener, add_special=False)
        single = tokenizer.token_id(fmt.opener)
        self._opener_token = single if single is not None and self._opener_ids == [single] else None
        self._opener = fmt.opener.encode("utf-8").decode("latin-1")  # matched against token bytes
        self._overruns = None if self._opener_token is not None else _overruns(tokenizer, fmt.opener)
        self._limit: int | None = None
        self.reset()

    def reset(self) -> None:
        self._call.reset()
        self._phase = OPENING if self.use.must_call else FREE
        self._forced = list(self._opener_ids) if self.use.must_call else []
        self._tail = ""  # the free text's end, as long as the opener (bytes as latin-1 characters)
        self._used = 0

    def set_budget(self, tokens: int | None) -> None:
        self._limit = tokens

    @property
    def closed_early(self) -> bool:
        return self._call.closed_early

    @property
    def in_call(self) -> bool:
        return self._phase == CALL

    # -- the processor seam ---------------------------------------------------------------------------
    def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
        if self._phase == CALL:
            self._call.process(logits, history)
        elif self._phase in (OPENING, AFTER):
            allowed = self._next_allowed()
            kept = logits[allowed]
            logits[:] = -np.inf
            logits[allowed] = kept if self._phase == AFTER else 0.0
        else:
            banned = self._banned(self._tail)
            if banned is not None:
                logits[banned] = -np.inf

    def vet(self, token: int) -> int | None:
        if self._phase == CALL:
            return self._call.vet(token)
        if self._phase == AFTER:
            return token if token in self._next_allowed() else None
        return self._forced[0] if self._phase == OPENING else token

    def commit(self, token: int) -> None:
        self._used += 1
        if self._phase == CALL:
            self._call.commit(token)
            if self._call.finished and not self.format.ends_reply:  # more text or calls may follow
                self._phase, self._tail = (AFTER if self.use.must_call else FREE), ""
            return
        if self._phase == AFTER:  # the opener's first token (the stop ends the reply before any commit)
            self._phase, self._forced = OPENING, list(self._opener_ids)
        if self._phase == OPENING:
            self._forced.pop(0)
            if not self._forced:
                self._start_call()
            return
        self._tail = self._pushed(self._tail, token)
        if token == self._opener_token or (self._opener_token is None and self._tail.endswith(self._opener)):
            self._start_call()

    def forced_tokens(self) -> list[int]:
        if self._phase == CALL:
            return self._call.forced_tokens()
        return list(self._forced)

    def valid_prefix_len(self, tokens: Sequence[int]) -> int:
        if self._phase == CALL:
            return self._call.valid_prefix_len(tokens)
        if self._phase == AFTER:
            return int(bool(tokens) and tokens[0] in self._next_allowed())
        if self._phase == OPENING:
            n = 0
            while n < min(len(tokens), len(self._forced)) and tokens[n] == self._forced[n]:
                n += 1
            return n
        tail = self._tail
        for i, token in enumerate(tokens):  # free text up to the opener; the call's tokens are not looked at
            banned = self._banned(tail)
            if banned is not None and token in banned:
                return i
            tail = self._pushed(tail, token)
            if token == self._opener_token or (self._opener_token is None and tail.endswith(self._opener)):
                return i + 1
        return len(tokens)

    # -- helpers --------------------------------------------------------------------------------------
    def _next_allowed(self) -> list[int]:
        """OPENING: the opener's next token; AFTER: the stop or the opener's first token."""
        return [self._forced[0]] if self._phase == OPENING else [self.stop_id, self._opener_ids[0]]

    def _start_call(self) -> None:
        self._phase = CALL
        self._call.reset()
        if self._limit is not None:  # the call ends whole within what is left of the reply, where it can
            try:
                self._call.set_budget(max(self._limit - self._used, 1))
            except ReplyBudgetTooSmall:
                self._call.set_budget(None)

    def _pushed(self, tail: str, token: int) -> str:
        return (tail + self.tokenizer.token_bytes(token).decode("latin-1"))[-len(self._opener):]

    def _banned(self, tail: str) -> np.ndarray | None:
        """The tokens that would complete the opener after `tail` and run on past it."""
        if self._overruns is None:
            return None
        found = [ids for k, ids in enumerate(self._overruns) if ids.size and tail.endswith(self._opener[:k])]
        return np.concatenate(found) if found else None


@functools.lru_cache(maxsize=8)
def _overruns(tokenizer: Tokenizer, opener: str) -> tuple[np.ndarray, ...]:
    """Per k, the tokens whose bytes start with the opener's rest after its first k bytes and go on past it."""
    data = opener.encode("utf-8")
    pieces = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
    return tuple(np.array([i for i, b in enumerate(pieces) if len(b) > len(data) - k and b.startswith(data[k:])],
                          dtype=np.int64) for k in range(len(data)))
