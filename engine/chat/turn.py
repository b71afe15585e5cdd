"""One reply in progress (spec 13.8.2): the request it answers, its steps, and what it reports.

A turn prefills what its conversation's cache lacks of the request, then takes one step per sampled token:
sample -> stop check -> commit -> budget. A model whose template writes reasoning (engine.chat.reasoning) has
its reply's text split as it commits: the turn hands out answer pieces (str) and reasoning pieces (Thought)
in order, and records both apart. The plain decode loop (engine.chat.conversation), the speculative
one (engine.chat.speculation) and the lockstep batch (engine.chat.lockstep) all drive these same steps, so
their replies agree token for token. At its end a turn records its result on the conversation and brings the
conversation's sidecar up to date.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Protocol

import numpy as np

from engine.chat.options import ChatOptions
from engine.chat.reasoning import ReasoningAware, ReasoningSplitter, Thought
from engine.chat.templates import Message, Template
from engine.chat.tool_render import tool_format_of
from engine.kv.cache import KvCache
from engine.models.validate import check_logits
from engine.sampling import Sampler
from engine.speculative import Stats as SpecStats
from engine.tokenize import StreamDecoder, Tokenizer
from engine.tools import ToolCall


_TAIL_TOKENS = 16  # the prompt's last tokens, which say whether it opened the reply's reasoning


@dataclass
class TurnStats:
    prompt_tokens: int = 0     # the context the reply is conditioned on (after the prefix): reused + prefilled
    reused_tokens: int = 0     # already in the KV cache, not prefilled again
    prefilled_tokens: int = 0
    generated_tokens: int = 0  # committed reply tokens (a stop token is not one)
    prefill_ms: float = 0.0
    ttft_ms: float = 0.0       # turn start to the first sampled token
    decode_tps: float = 0.0    # sampled tokens per second after the first
    spec: SpecStats | None = None  # the speculative decoder's counts, on a speculative turn
    reasoning_tokens: int = 0  # committed inside the reasoning (its markers not counted)
    reasoning_ms: float = 0.0  # from the first reasoning text to the last


@dataclass
class TurnResult:
    text: str  # the answer (without the reasoning)
    token_ids: list[int]
    finish_reason: str  # stop | stop_sequence | length | length_closed | context | cancelled | error
    fired_stop: int | None = None  # index into stop_sequences when one ended the reply
    stats: TurnStats = field(default_factory=TurnStats)
    error: BaseException | None = None
    # a JSON schema reply's violations of the keywords not enforced while writing (checked after it)
    schema_warnings: tuple[str, ...] = ()
    reasoning: str = ""  # the reasoning the reply wrote before its answer, when its template has a format
    tool_calls: tuple[ToolCall, ...] = ()  # the calls the reply made (its text is then what was around them)


@dataclass
class TurnRequest:
    ids: list[int]
    reuse: bool             # reconcile with the cache by longest common prefix (ids are a full render)
    user: str | None = None  # the user message, when the turn came from send()
    tool_results: tuple[Message, ...] = ()  # the tool messages the turn answers (send_tool_results)
    on_prefill: Callable[[int, int], None] | None = None  # (tokens fed, tokens to feed), between slices


class Prefilled(NamedTuple):
    """What reconciling the memory with a request did: the last prompt token's logits (None: cancelled
    between two slices), the positions kept from before and the tokens fed."""

    logits: np.ndarray | None
    reused: int
    fed: int


class TurnOwner(Protocol):
    """What a turn reads and changes of its conversation (engine.chat.conversation.Conversation, which imports
    this module). The turn is a part of the conversation's work, so it reaches the conversation's own state."""

    options: ChatOptions
    sampler: Sampler
    tokenizer: Tokenizer
    template: Template
    cache: KvCache
    prefix_rows: int
    reply_tokens: int
    last_turn: TurnResult | None
    messages: list[Message]
    _history: list[int]
    _decoder: StreamDecoder
    _stop_sequences: list[bytes]

    def _prefill(self, request: TurnRequest, cancel: threading.Event | None) -> Prefilled:
        ...

    def _ending(self, reply: bytes, token: int) -> tuple[str, int | None] | None:
        ...

    def _save(self) -> None:
        ...


class Turn:
    """One reply in progress: sampling, stop checks, streaming and statistics for one conversation."""

    def __init__(self, convo: TurnOwner, request: TurnRequest, cancel: threading.Event | None):
        self.convo, self.request, self.cancel = convo, request, cancel
        self.ids: list[int] = []
        self.reply = b""
        self.parts: list[str] = []  # the answer's pieces
        self.reasoning: list[str] = []  # the reasoning's pieces
        self.splitter: ReasoningSplitter | None = None  # set at the prefill, when the template has a format
        self._pieces: list[str] = []  # pieces committed since the loop last took them
        self._reasoning_span: tuple[float, float] | None = None
        self.done = False
        self.stats = TurnStats()
        self._start = time.perf_counter()
        self._sampled = 0
        self._first_at = self._last_at = 0.0
        convo.reply_tokens = 0

    @property
    def next_token(self) -> int:
        return self.ids[-1]

    def prefill(self) -> np.ndarray:
        c = self.convo
        if c.sampler.processor is not None:
            c.sampler.processor.reset()
            c.sampler.processor.set_budget(c.options.max_tokens)  # a grammar's reply ends whole within it
        c._decoder.reset()
        if c.template.reasoning is not None:  # where the prompt leaves the reply: inside its reasoning or not
            tail = b"".join(c.tokenizer.token_bytes(t) for t in self.request.ids[-_TAIL_TOKENS:])
            if c.options.split_reasoning:
                self.splitter = ReasoningSplitter(c.template.reasoning, tail.decode("utf-8", "replace"))
            if isinstance(c.sampler.processor, ReasoningAware):  # every marker is ASCII: bytes as characters
                c.sampler.processor.begin(tail.decode("latin-1"))
        prefilled = c._prefill(self.request, self.cancel)
        self.stats.prefill_ms = (time.perf_counter() - self._start) * 1e3
        self.stats.reused_tokens, self.stats.prefilled_tokens = prefilled.reused, prefilled.fed
        self.stats.prompt_tokens = prefilled.reused + prefilled.fed
        logits = prefilled.logits
        if logits is None:
            self.end("cancelled")
        return logits

    def accept(self, logits: np.ndarray) -> list[str]:
        """Sample the next token; return the pieces it completes (answer: str, reasoning: Thought)."""
        if self.cancelled():
            self.end("cancelled")
            return self.take_pieces()
        token = self.sample(logits)
        stop = self.stop_check(token)
        if stop is not None:
            self.end(stop[0], fired=stop[1])
            return self.take_pieces()
        self.convo._history.append(token)
        self.commit(token)
        if spent := self.budget_spent():
            self.end(spent)
        return self.take_pieces()

    def take_pieces(self) -> list[str]:
        """The pieces committed (or, at the end, released) since the last call, in order."""
        pieces, self._pieces = self._pieces, []
        return pieces

    # The steps of `accept`, shared with the speculative loop (engine.chat.speculation), which samples,
    # checks and commits several tokens per forward.
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def sample(self, logits: np.ndarray) -> int:
        """One draw from the conversation's sampler, conditioned on the committed history; a broken model's
        non-finite logits fail the turn instead of being sampled."""
        c = self.convo
        check_logits(logits, c.prefix_rows + len(c._history) - 1)  # the row's position, in either loop
        token = c.sampler.sample(logits, c._history)
        self._count_sample()
        return token

    def stop_check(self, token: int) -> tuple[str, int | None] | None:
        """(finish reason, fired stop sequence) when the sampled `token` ends the reply; it is then neither
        committed nor streamed."""
        return self.convo._ending(self.reply, token)

    def commit(self, token: int) -> None:
        """Add a token the history already holds to the reply; its pieces wait in take_pieces."""
        self.ids.append(token)
        self.convo.reply_tokens = len(self.ids)
        self.reply += self.convo.tokenizer.token_bytes(token)
        text = self.convo._decoder.push(token)
        if self.splitter is None:
            self._add(text)
            return
        was = self.splitter.in_reasoning
        for piece in self.splitter.push(text):
            self._add(piece)
        if was and self.splitter.in_reasoning:
            self.stats.reasoning_tokens += 1

    def _add(self, piece: str) -> None:
        if not piece:
            return
        if isinstance(piece, Thought):
            now = time.perf_counter()
            self._reasoning_span = (self._reasoning_span or (now, now))[0], now
            self.reasoning.append(piece)
        else:
            self.parts.append(piece)
        self._pieces.append(piece)

    def budget_spent(self) -> str | None:
        """The finish reason when the reply may not grow: its token budget, or no cache room to forward
        the token just committed."""
        c = self.convo
        if len(self.ids) >= c.options.max_tokens:
            return "length"
        if c.cache.len >= c.cache.capacity:
            return "context"
        return None

    def end(self, reason: str, error: BaseException | None = None, fired: int | None = None) -> None:
        c = self.convo
        if reason in ("length", "stop") and c.sampler.processor is not None and c.sampler.processor.closed_early:
            reason = "length_closed"  # the grammar's document was closed to fit the limit
        c._decoder.reset()  # a character the reply ends inside of is no text
        if self.splitter is not None:  # what it held back waiting for a marker is text after all
            for piece in self.splitter.finish():
                self._add(piece)
        self.done = True
        s = self.stats
        if self._reasoning_span is not None:
            s.reasoning_ms = (self._reasoning_span[1] - self._reasoning_span[0]) * 1e3
        s.generated_tokens = len(self.ids)
        if self._sampled > 1:
            s.decode_tps = (self._sampled - 1) / max(self._last_at - self._first_at, 1e-9)
        text, calls = "".join(self.parts), ()
        if c.options.tools is not None and c.options.tools.active and reason in ("stop", "length", "length_closed"):
            names = {t.name for t in c.options.tools.callable}
            parsed = tool_format_of(c.template).parse_reply(self.reply.decode("utf-8", "replace"), text, names)
            text, calls = parsed.content, parsed.calls
        checked = c.options.grammar is not None and reason in ("stop", "length_closed")
        warnings = tuple(map(str, c.options.grammar.check_reply(text))) if checked else ()
        reasoning = "".join(self.reasoning)
        c.last_turn = TurnResult(text, self.ids, reason, fired, s, error, warnings, reasoning, calls)
        if self.request.user is not None or self.request.tool_results:
            asked = [Message("user", self.request.user)] if self.request.user is not None else []
            c.messages += [*asked, *self.request.tool_results, Message("assistant", text, reasoning, calls)]
        c._save()

    def _count_sample(self) -> None:
        now = time.perf_counter()
        if not self._sampled:
            self._first_at = now
            self.stats.ttft_ms = (now - self._start) * 1e3
        self._last_at = now
        self._sampled += 1
