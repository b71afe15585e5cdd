"""Multi-turn chat over one KV cache (spec 13.8.2).

A Conversation keeps a model's KV cache across turns: each turn prefills only tokens the cache does not
hold yet, then decodes token by token (sample -> stop check -> stream -> forward). Replies stream as a
generator of text pieces; a `threading.Event` cancels between tokens.

State: `history` is every committed token after the preloaded prefix. The cache holds
positions [0, prefix_rows) for the prefix and the first `cache.len - prefix_rows` history tokens; history
may run one token ahead (a turn that ended on its token budget never forwarded its last token), and the
next prefill feeds it first. Any error leaves that invariant intact, so a conversation stays resendable.
The stop token that ends a reply is never committed: the next turn's render closes the turn itself.
Each reply is a turn (engine.chat.turn), whose steps (sample, stop check, commit, budget) the plain loop
here drives; so do the speculative loop, with `speculation` on (engine.chat.speculation: over verified
drafts, with the plain turn's output and cache), and the lockstep batch of several conversations
(engine.chat.lockstep).

A conversation may be served behind attached documents (attach): their cartridges' KV rows fill the cache
as the preloaded prefix, and their tokens become frozen draft references for speculation.

With persistence on (enable_persistence), every turn's end brings the conversation's KV sidecar
(engine.chat.sidecar) up to the cache, so a reopened chat resumes without prefilling again.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Callable, Generator, Iterator, Sequence

import numpy as np

from engine.cartridge.cartridge import Cartridge, composed_rows, composition_identity, write_composed
from engine.chat.jinja_template import JinjaTemplate
from engine.chat.model_template import stop_token_id, template_for_model
from engine.chat.options import ChatOptions
from engine.chat.sidecar import Sidecar
from engine.chat.speculation import run_speculative
from engine.chat.templates import Message, Template
from engine.chat.answer_grammar import AnswerGrammar
from engine.chat.thinking_budget import ThinkingBudget
from engine.chat.tool_constraint import ToolCallConstraint
from engine.chat.tool_render import render_with_tools, tool_format_of
from engine.chat.turn import Prefilled, Turn, TurnRequest, TurnResult
from engine.errors import ContextFull, InvalidPrefix
from engine.kv.cache import KvCache
from engine.models.model import UBATCH, Model
from engine.sampling import Sampler
from engine.speculative import SpeculativeStream
from engine.speculative.cascade import SourceStats
from engine.speculative.next_token import NextTokenDrafts
from engine.sampling.grammar import grammar_processor
from engine.tokenize import StreamDecoder, Tokenizer, load_tokenizer


@dataclass
class WarmState:
    """A KV cache and the tokens behind its positions [prefix_rows, cache.len), to resume a conversation."""
    cache: KvCache
    tokens: Sequence[int]
    prefix_rows: int = 0


@dataclass(frozen=True)
class DecodeStep:
    """A batched turn's next token to forward into its conversation's cache (send_tokens(batched=True))."""
    token: int
    cache: KvCache


class Conversation:
    """One chat's KV cache, token history and sampler. Single-threaded mutable state."""

    def __init__(self, model: Model, tokenizer: Tokenizer, template: Template | JinjaTemplate,
                 options: ChatOptions | None = None, *, warm: WarmState | None = None):
        self.model, self.tokenizer, self.template = model, tokenizer, template
        self.options = options or ChatOptions()
        self.system = self.options.system
        self.messages: list[Message] = []  # the chat as send() saw it
        self.last_turn: TurnResult | None = None
        self.reply_tokens = 0  # tokens the reply in progress (else the last one) has so far: for a live rate
        if warm is None:
            warm = WarmState(model.new_cache(self.options.capacity, self.options.kv_dtype), [])
        if not 0 <= warm.prefix_rows <= warm.cache.len:
            raise InvalidPrefix(f"warm prefix of {warm.prefix_rows} rows, but the cache holds {warm.cache.len}")
        # the adopted capacity governs; the tokens describe the cache and clamp it
        self.cache, self.prefix_rows = warm.cache, warm.prefix_rows
        self._history = list(warm.tokens[: warm.cache.len - warm.prefix_rows])
        self.cache.truncate(self.prefix_rows + len(self._history))
        self._apply_reply_options()
        self._decoder = StreamDecoder(tokenizer)
        self._sidecar: Sidecar | None = None  # once persistence is on
        self._speculation: SpeculativeStream | None = None  # built at the first speculative turn (it may measure)
        self._next_token: NextTokenDrafts | None = None  # the model's next-token layer's drafts, where it has one
        self._references: list[Sequence[int]] = []  # attached documents' tokens, drafted from when speculating
        self._prefix_identity: bytes | None = None  # which cartridges built the prefix (attach)

    @classmethod
    def for_model(cls, model: Model, options: ChatOptions | None = None, *,
                  tokenizer: Tokenizer | None = None, warm: WarmState | None = None) -> "Conversation":
        """A conversation with the model's own tokenizer and chat template (engine.chat.model_template)."""
        tokenizer = tokenizer or load_tokenizer(model.file.metadata)
        return cls(model, tokenizer, template_for_model(model.file.metadata, tokenizer), options, warm=warm)

    def reconfigure(self, options: ChatOptions) -> None:
        """Reply settings for the turns that follow (sampler and seed, stops, grammar, budget, speculation):
        one cache serving requests that each bring their own (engine.serving.service). The cache, its history and
        the sidecar stay; the cache keeps its capacity and KV type."""
        self.options = options
        self.system = options.system
        self._apply_reply_options()

    def _apply_reply_options(self) -> None:
        tokenizer, template, options = self.tokenizer, self.template, self.options
        # the template's stop marker (else EOS)
        stop = {stop_token_id(tokenizer, template)} - {None}
        processor = options.processor
        if options.grammar is not None:  # built here, where the stop marker is known
            processor = grammar_processor(options.grammar, tokenizer, stop_token_id(tokenizer, template))
            if template.reasoning is not None and options.split_reasoning:  # it holds the answer, not the reasoning
                processor = AnswerGrammar(template.reasoning, tokenizer, processor, self._ends(stop))
        if options.tools is not None and options.tools.active:  # free text, each call held to its tool's schema
            calls = tool_format_of(template)
            processor = ToolCallConstraint(calls, options.tools, tokenizer, stop_token_id(tokenizer, template))
            stop |= {processor.closing_id} - {None}
            if template.reasoning is not None and options.split_reasoning and not calls.in_headers:
                # calls are made in the answer
                processor = AnswerGrammar(template.reasoning, tokenizer, processor, self._ends(stop))
        if options.thinking_budget is not None and template.reasoning is not None:
            processor = ThinkingBudget(template.reasoning, tokenizer, options.thinking_budget, processor)
        self.sampler = Sampler(options.sampler, processor)
        self._stop_ids = self._ends(stop)
        self._stop_sequences = [s.encode("utf-8") for s in options.stop_sequences]

    def _ends(self, stop: set[int]) -> frozenset[int]:
        """The tokens that end a reply: `stop`, every end-of-generation token and the caller's extras."""
        return frozenset(self.tokenizer.eog_ids) | stop | set(self.options.extra_stop_ids)

    # -- state ----------------------------------------------------------------------------------------
    @property
    def history(self) -> list[int]:
        return list(self._history)

    @property
    def sidecar_error(self) -> str | None:
        """Why the last sidecar write failed, if it did; the next turn's end rewrites the sidecar whole."""
        return None if self._sidecar is None else self._sidecar.error

    def reset(self) -> None:
        """Forget the chat (the preloaded prefix stays)."""
        self._truncate(self.prefix_rows)
        self._history, self.messages = [], []
        self._save()

    def declare_prefix(self, rows: int) -> None:
        """Declare cache positions [0, rows) a preloaded prefix with no tokens behind them (a cartridge):
        once, on a fresh conversation whose cache holds exactly those rows. No reuse rewinds into it."""
        cache = self._live_cache()
        if self.prefix_rows or self._history or rows <= 0 or cache.len != rows:
            raise InvalidPrefix(f"a prefix must be declared once, before any turn, over exactly the rows the "
                                f"cache holds ({cache.len}); got {rows}")
        self.prefix_rows = rows

    def attach(self, cartridges: Sequence[Cartridge]) -> None:
        """Serve the chat behind documents' KV cartridges (engine.cartridge): their rows, in order, become the
        preloaded prefix, and their tokens draft references for speculation. Once, on a fresh conversation,
        before enable_persistence: the sidecar then resumes only behind these same cartridges (another
        attachment set makes it foreign, and the chat is prefilled again behind the new prefix)."""
        cache = self._live_cache()
        if self.prefix_rows or self._history or cache.len or self._sidecar is not None:
            raise InvalidPrefix("documents are attached once, to a conversation that has no prefix, no turn and "
                                "no persistence yet")
        write_composed(cartridges, cache)
        if cache.len >= cache.capacity:
            cache.reset()
            raise ContextFull(f"the attached documents take {composed_rows(cartridges)} positions, the whole "
                              f"context of {cache.capacity}: no room is left for the chat")
        self.declare_prefix(cache.len)
        self._prefix_identity = composition_identity(cartridges)
        self._references = [c.draft_reference.tolist() for c in cartridges]

    def copy_prefix(self, source: "Conversation", n: int) -> None:
        """Start over from the first `n` cached positions of another conversation on the same model (a
        prompt prefix it already computed, copied instead of prefilled again); the sidecar is rewritten
        from there at the next turn's end. A memory that cannot give its first n positions alone
        (engine.kv.memory) gives what it can (up to its last mark before n): the rest is read again."""
        cache, source_cache = self._live_cache(), source._live_cache()
        if self.prefix_rows or source.prefix_rows:
            raise InvalidPrefix("a conversation with a preloaded prefix neither gives nor takes a copied one")
        n = source_cache.truncation_point(n)  # a state gives its first n positions only at a mark
        if n == 0:
            return
        self._truncate(0)  # the sidecar rewrites from 0: its rows are another chat's
        cache.copy_prefix(source_cache, n)
        self._history = source._history[:n]

    def take_cache(self) -> WarmState:
        """Release the cache and the tokens behind it (for another Conversation's `warm`); this
        conversation cannot send afterwards."""
        cache = self._live_cache()
        state = WarmState(cache, self._history[: cache.len - self.prefix_rows], self.prefix_rows)
        self.cache = None
        return state

    def enable_persistence(self, path: str | os.PathLike) -> int:
        """Keep this chat's KV cache in a sidecar file (engine.chat.sidecar): once, before any turn. A saved
        conversation there of this model and cache geometry resumes (its tokens and KV rows, its prefix
        included; zero re-prefill); any other file starts over. Returns the resumed positions (0: a fresh
        start). Every turn then appends its new positions. The sidecar holds tokens, not messages: a model's
        own Jinja template re-renders the chat from `messages`, which the caller restores."""
        cache = self._live_cache()
        if self._sidecar is not None or self._history:
            raise RuntimeError("persistence is enabled once, on a conversation that has not had a turn yet")
        if not cache.persistable:  # engine.kv.memory: this chat reopens by reading its messages again
            return 0
        self._sidecar, loaded = Sidecar.open(path, self.model.file, self._prefix_identity, cache, self.prefix_rows)
        if loaded is not None:
            self._history, self.prefix_rows = loaded.tokens, loaded.prefix_rows
        self._save()
        return 0 if loaded is None else cache.len

    def _save(self) -> None:
        """Mark the turn's end in the memory (where a re-rendered history rewinds to: engine.kv.memory) and
        bring the sidecar up to the cache. With a sidecar, a committed token the turn left unforwarded is
        forwarded first: the sidecar holds positions only."""
        cache = self.cache
        if self._sidecar is not None:
            pending = self._history[cache.len - self.prefix_rows:]
            if pending and cache.len < cache.capacity:
                self.model.feed(pending, cache)
        cache.mark()
        if self._sidecar is not None:
            self._sidecar.save(cache, self._history[: cache.len - self.prefix_rows], self.prefix_rows)

    def _truncate(self, positions: int) -> None:
        """Keep the cache's first `positions` (a memory that cannot be cut there must not be asked to:
        engine.kv.memory); the sidecar is rewritten from there at the next save."""
        cache = self._live_cache()
        if not cache.can_truncate(positions):
            raise RuntimeError(f"this model's memory cannot be cut to {positions} positions")
        cache.truncate(positions)
        self._rewound()

    def _rewound(self) -> None:
        if self._sidecar is not None:
            self._sidecar.rewind(self.cache.len)

    def _live_cache(self) -> KvCache:
        if self.cache is None:
            raise RuntimeError("this conversation's KV cache was taken (take_cache)")
        return self.cache

    # -- turns ----------------------------------------------------------------------------------------
    def send(self, user: str, cancel: threading.Event | None = None, *,
             on_prefill: Callable[[int, int], None] | None = None) -> Iterator[str]:
        """Stream the reply to one user message. Built-in formats render just the new turn; a model's own
        Jinja template renders the whole chat and reuses the cached common prefix. `cancel` and
        `on_prefill` as in send_rendered."""
        request = self.user_request(user)
        request.on_prefill = on_prefill
        return self._stream(request, cancel)

    def send_rendered(self, rendered: str, cancel: threading.Event | None = None, *, reuse: bool = False,
                      on_prefill: Callable[[int, int], None] | None = None) -> Iterator[str]:
        """Stream the reply to caller-rendered template text (e.g. Template.render_messages). With `reuse`,
        `rendered` is a full-history render: the cache keeps its longest common token prefix with it and
        only the rest is prefilled (last_turn.stats.reused_tokens says how much was kept). The prefill runs
        in the model's slices of UBATCH tokens: `on_prefill(fed, total)` hears of each, and `cancel` set
        between two of them ends the turn there."""
        add_special = self.prefix_rows == 0 and (reuse or not self._history)
        return self.send_tokens(self.tokenizer.encode(rendered, add_special=add_special), cancel, reuse=reuse,
                                on_prefill=on_prefill)

    def send_tokens(self, ids: Sequence[int], cancel: threading.Event | None = None, *, reuse: bool = False,
                    on_prefill: Callable[[int, int], None] | None = None,
                    batched: bool = False) -> Generator[str | DecodeStep, np.ndarray | None, None]:
        """send_rendered over pre-encoded ids. With `batched`, a plain turn does not forward its tokens
        itself: it yields a DecodeStep for each, and the caller forwards them (model.decode_batch over the
        steps of several conversations: engine.serving.service) and sends the step's logits row back."""
        if not len(ids):
            raise ValueError("the prompt is empty")
        return self._stream(TurnRequest([int(t) for t in ids], reuse, on_prefill=on_prefill), cancel, batched)

    def user_request(self, user: str) -> TurnRequest:
        """The turn one user message asks for (send, and the lockstep batch's send_batch). A built-in format
        renders just the new turn, unless its replies reason or the chat has tools (engine.chat.tool_render):
        then, as with a model's own template, the whole chat is rendered (past replies without the reasoning the format drops) and the cache keeps the
        longest common prefix, so it holds what a fresh render of the chat holds."""
        plain = self.template.reasoning is None and not self._tool_chat(self.messages)
        if isinstance(self.template, Template) and plain:
            first = not self._history
            text = self.template.render_turn(user, system=self.system, first=first,
                                             think_off=self.options.think_off)
            ids = self.tokenizer.encode(text, add_special=first and self.prefix_rows == 0)
            return TurnRequest(ids, reuse=False, user=user)
        system = [Message("system", self.system)] if self.system is not None else []
        text = self.render([*system, *self.messages, Message("user", user)])
        return TurnRequest(self.tokenizer.encode(text, add_special=self.prefix_rows == 0), reuse=True, user=user)

    def send_tool_results(self, results: Sequence[Message], cancel: threading.Event | None = None, *,
                          on_prefill: Callable[[int, int], None] | None = None) -> Iterator[str]:
        """Stream the reply that follows the last reply's tool calls, given their results (Message.tool_result,
        one per call, in order). The whole chat is rendered and the cache keeps what it shares."""
        last = self.messages[-1] if self.messages else None
        if last is None or last.role != "assistant" or not last.tool_calls:
            raise ValueError("tool results answer the last reply's tool calls, and it made none")
        if [m.tool_call_id for m in results] != [c.id for c in last.tool_calls]:
            raise ValueError("tool results must answer the last reply's calls, one each, in order")
        system = [Message("system", self.system)] if self.system is not None else []
        text = self.render([*system, *self.messages, *results])
        request = TurnRequest(self.tokenizer.encode(text, add_special=self.prefix_rows == 0), reuse=True,
                              tool_results=tuple(results), on_prefill=on_prefill)
        return self._stream(request, cancel)

    def render(self, messages: Sequence[Message]) -> str:
        """A full history rendered for a reply, with this chat's thinking settings and tools."""
        if self._tool_chat(messages):
            tools = self.options.tools.tools if self._with_tools() else ()
            return render_with_tools(self.template, messages, tools, think_off=self.options.think_off,
                                     reasoning_effort=self.options.reasoning_effort)
        return self.template.render_messages(messages, think_off=self.options.think_off,
                                             reasoning_effort=self.options.reasoning_effort)

    def _with_tools(self) -> bool:
        return self.options.tools is not None and self.options.tools.active

    def _tool_chat(self, messages: Sequence[Message]) -> bool:
        """Tools are offered, or the chat holds calls and results: it renders whole, through tool_render."""
        return self._with_tools() or any(m.role == "tool" or m.tool_calls for m in messages)

    def draft_sources(self) -> list[SourceStats]:
        """What each of speculation's draft sources drafted, had accepted and cost; empty before the first
        speculative reply."""
        return self._speculation.index.source_stats() if self._speculation is not None else []

    def _follow_for_drafts(self) -> None:
        """Before a prefill: a model's next-token layer follows the cache, so it reads the prompt's rows too
        (the speculative stream that drafts from it is built after the first prefill)."""
        if not (self.options.speculation and self.options.model_drafts):
            return
        self._next_token = self._next_token or NextTokenDrafts.of(self.model)
        if self._next_token is not None:
            self._next_token.follow(self._live_cache())

    def _stream(self, request: TurnRequest, cancel: threading.Event | None,
                batched: bool = False) -> Generator[str | DecodeStep, np.ndarray | None, None]:
        turn = Turn(self, request, cancel)
        self._follow_for_drafts()
        logits = turn.prefill()
        if turn.done:  # stopped during the prefill
            return
        try:
            # speculation starts once its verify kernels are compiled (the first run compiles them in the
            # background): a reply before that decodes plainly, which gives the same tokens
            if self.options.speculation and self.model.rows_ready(self.cache):
                if self._speculation is None:
                    self._speculation = SpeculativeStream(self.model, model_drafts=self.options.model_drafts,
                                                          next_token=self._next_token)
                    for reference in self._references:
                        self._speculation.index.add_reference(reference)
                yield from run_speculative(turn, self._speculation, logits)
                return
            while True:
                yield from turn.accept(logits)
                if turn.done:
                    return
                if batched:
                    logits = yield DecodeStep(turn.next_token, self.cache)
                else:
                    logits = self.model.forward([turn.next_token], self.cache)
        except BaseException as e:  # the consumer closed the stream (GeneratorExit), Ctrl-C, a failing step
            if not turn.done:
                turn.end("cancelled" if isinstance(e, (GeneratorExit, KeyboardInterrupt)) else "error", e)
            raise

    def _prefill(self, request: TurnRequest, cancel: threading.Event | None) -> Prefilled:
        """Reconcile the cache with the request and feed what it lacks."""
        cache = self._live_cache()
        cached = cache.len - self.prefix_rows
        if request.reuse:  # logits are not cached state: at least the last prompt token is fed again
            keep = min(common_prefix_len(request.ids, self._history[:cached]), len(request.ids) - 1)
            # a memory that cannot be cut there keeps what it can (a state: up to its last mark) and reads on
            keep = max(0, cache.truncation_point(self.prefix_rows + keep) - self.prefix_rows)
            history = request.ids
        else:
            keep, history = cached, self._history + request.ids
        need = self.prefix_rows + len(history)
        if need > cache.capacity:
            raise ContextFull(f"context full: the conversation needs {need} positions but its context holds "
                              f"{cache.capacity}; start over (reset) or use a larger context")
        self._truncate(self.prefix_rows + keep)
        before = cache.checkpoint()
        feed = history[keep:]
        logits = self._feed(feed, cancel, request.on_prefill)
        if logits is None:
            if request.reuse:  # what was fed stays: a resend of this render resumes from it
                self._history = list(history[: cache.len - self.prefix_rows])
            else:  # a part of a turn cannot stay under the turns that follow it
                cache.restore(before)
                self._rewound()
            return Prefilled(None, keep, cache.len - self.prefix_rows - keep)
        self._history = list(history)
        return Prefilled(logits, keep, len(feed))

    def _feed(self, tokens: list[int], cancel: threading.Event | None,
              on_prefill: Callable[[int, int], None] | None) -> np.ndarray | None:
        """Forward `tokens` in the slices model.forward would cut, reporting progress and checking `cancel`
        between them; the last token's logits, or None when stopped. The last token is fed alone (a row-wise
        step): the first logits of a reply are then bitwise the same whether the cache held the prompt but
        its last token (a resent request, a reopened chat) or nothing, so a seeded reply reproduces."""
        total = len(tokens)
        for start in range(0, total, UBATCH):
            if on_prefill is not None:
                on_prefill(start, total)
            if start and cancel is not None and cancel.is_set():
                return None
            span = tokens[start: start + UBATCH]
            if start + UBATCH < total:
                self.model.feed(span, self.cache)
                continue
            if len(span) > 1:
                self.model.feed(span[:-1], self.cache)
            self.cache.mark()  # the prompt but its last token: where a regenerated reply rewinds to
            logits = self.model.forward(span[-1:], self.cache)
        if on_prefill is not None:
            on_prefill(total, total)
        return logits

    def _ending(self, reply: bytes, token: int) -> tuple[str, int | None] | None:
        """(finish reason, fired stop sequence) when `token`, following the reply bytes `reply`, ends it."""
        if token in self._stop_ids:
            return "stop", None
        fired = self._stop_sequence_completed(reply, self.tokenizer.token_bytes(token))
        return None if fired is None else ("stop_sequence", fired)

    def _stop_sequence_completed(self, reply: bytes, piece: bytes) -> int | None:
        """The first stop sequence that the reply completes with `piece`, if any."""
        for i, seq in enumerate(self._stop_sequences):
            if seq in reply[max(0, len(reply) - len(seq) + 1):] + piece:
                return i
        return None


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if not n:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n
