"""Multi-turn chat over one KV cache (spec 13.8.2).

A Conversation keeps a model's KV cache across turns: each turn prefills only tokens the cache does not
hold yet, then decodes token by token (sample -> stop check -> stream -> forward). Replies stream as a
generator of text pieces; a `threading.Event` cancels between tokens.

State: `history` is every committed token after the preloaded prefix. The cache holds
positions [0, prefix_rows) for the prefix and the first `cache.len - prefix_rows` history tokens; history
may run one token ahead (a turn that ended on its token budget never forwarded its last token), and the
next prefill feeds it first. Any error leaves that invariant intact, so a conversation stays resendable.
The stop token that ends a reply is never committed: the next turn's render closes the turn itself.
With `speculation` on, a reply decodes through engine.chat.speculation, which drives the same turn steps
(sample, stop check, commit, budget) over verified drafts: its output and its cache equal the plain turn's.
The lockstep batch stays plain.

A conversation may be served behind attached documents (attach): their cartridges' KV rows fill the cache
as the preloaded prefix, and their tokens become frozen draft references for speculation.

With persistence on (enable_persistence), every turn's end brings the conversation's KV sidecar up to the
cache, so a reopened chat resumes without prefilling again. The new positions are copied out at the turn's
end and written by a background writer (engine.kv.sidecar_writer), so the disk never stalls a reply.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Generator, Iterator, Sequence

import numpy as np

from engine.cartridge.cartridge import Cartridge, composed_rows, composition_identity, write_composed
from engine.chat.jinja_template import JinjaTemplate
from engine.chat.model_template import stop_token_id, template_for_model
from engine.chat.speculation import run_speculative
from engine.chat.templates import Message, Template
from engine.errors import ContextFull, InvalidPrefix
from engine.kv import persist as kv_persist
from engine.kv.cache import KvCache, KvDtype
from engine.kv.sidecar_writer import WRITER
from engine.models.transformer import UBATCH, Transformer
from engine.models.validate import check_logits
from engine.sampling import LogitProcessor, Sampler, SamplerConfig
from engine.speculative import SpeculativeStream, Stats as SpecStats
from engine.sampling.grammar import Grammar, grammar_processor
from engine.tokenize import StreamDecoder, Tokenizer, load_tokenizer


@dataclass(frozen=True)
class ChatOptions:
    system: str | None = None
    capacity: int = 4096                 # KV positions; the whole conversation must fit
    kv_dtype: KvDtype | str = KvDtype.F16
    max_tokens: int = 1024               # per reply
    think_off: bool = False              # render with the reasoning channel closed (ChatML, Gemma 4)
    sampler: SamplerConfig = SamplerConfig()
    extra_stop_ids: tuple[int, ...] = ()
    stop_sequences: tuple[str, ...] = ()  # a reply stops before the token that completes one
    processor: LogitProcessor | None = None  # re-armed (reset) at every turn start
    speculation: bool = False  # decode replies speculatively (engine.chat.speculation): same output, fewer forwards
    grammar: Grammar | None = None  # every reply follows it and ends on the stop marker (instead of processor)

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if any(not s for s in self.stop_sequences):
            raise ValueError("stop sequences must not be empty")
        if self.grammar is not None and self.processor is not None:
            raise ValueError("a chat takes a grammar or a logit processor, not both")


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


@dataclass
class TurnResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # stop | stop_sequence | length | length_closed | context | cancelled | error
    fired_stop: int | None = None  # index into stop_sequences when one ended the reply
    stats: TurnStats = field(default_factory=TurnStats)
    error: BaseException | None = None
    # a JSON schema reply's violations of the keywords not enforced while writing (checked after it)
    schema_warnings: tuple[str, ...] = ()


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


@dataclass
class _Request:
    ids: list[int]
    reuse: bool             # reconcile with the cache by longest common prefix (ids are a full render)
    user: str | None = None  # the user message, when the turn came from send()
    on_prefill: Callable[[int, int], None] | None = None  # (tokens fed, tokens to feed), between slices


class Conversation:
    """One chat's KV cache, token history and sampler. Single-threaded mutable state."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, template: Template | JinjaTemplate,
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
        self._sidecar: tuple[str, bytes] | None = None  # (path, model fingerprint) once persistence is on
        self._saved = 0  # leading cache positions the sidecar holds (or will, once its writes land)
        self.sidecar_error: str | None = None  # why the last sidecar write failed; the next turn rewrites it
        self._speculation: SpeculativeStream | None = None  # built at the first speculative turn (it may measure)
        self._references: list[Sequence[int]] = []  # attached documents' tokens, drafted from when speculating
        self._prefix_identity: bytes | None = None  # which cartridges built the prefix (attach)

    @classmethod
    def for_model(cls, model: Transformer, options: ChatOptions | None = None, *,
                  tokenizer: Tokenizer | None = None, warm: WarmState | None = None) -> "Conversation":
        """A conversation with the model's own tokenizer and chat template (engine.chat.model_template)."""
        tokenizer = tokenizer or load_tokenizer(model.file.metadata)
        return cls(model, tokenizer, template_for_model(model.file.metadata, tokenizer), options, warm=warm)

    def reconfigure(self, options: ChatOptions) -> None:
        """Reply settings for the turns that follow (sampler and seed, stops, grammar, budget, speculation):
        one cache serving requests that each bring their own (engine.service). The cache, its history and
        the sidecar stay; the cache keeps its capacity and KV type."""
        self.options = options
        self.system = options.system
        self._apply_reply_options()

    def _apply_reply_options(self) -> None:
        tokenizer, template, options = self.tokenizer, self.template, self.options
        # the template's stop marker (else EOS), every end-of-generation token, and the caller's extras
        stop = {stop_token_id(tokenizer, template)} - {None}
        processor = options.processor
        if options.grammar is not None:  # built here, where the stop marker is known
            processor = grammar_processor(options.grammar, tokenizer, stop_token_id(tokenizer, template))
        self.sampler = Sampler(options.sampler, processor)
        self._stop_ids = frozenset(tokenizer.eog_ids) | stop | set(options.extra_stop_ids)
        self._stop_sequences = [s.encode("utf-8") for s in options.stop_sequences]

    # -- state ----------------------------------------------------------------------------------------
    @property
    def history(self) -> list[int]:
        return list(self._history)

    def reset(self) -> None:
        """Forget the chat (the preloaded prefix stays)."""
        self._live_cache().truncate(self.prefix_rows)
        self._history, self.messages = [], []
        self._saved = min(self._saved, self.prefix_rows)
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
        from there at the next turn's end."""
        cache, source_cache = self._live_cache(), source._live_cache()
        if self.prefix_rows or source.prefix_rows:
            raise InvalidPrefix("a conversation with a preloaded prefix neither gives nor takes a copied one")
        n = min(n, source_cache.len)
        cache.truncate(0)
        cache.copy_rows(source_cache, 0, n)
        self._history = source._history[:n]
        self._saved = 0

    def take_cache(self) -> WarmState:
        """Release the cache and the tokens behind it (for another Conversation's `warm`); this
        conversation cannot send afterwards."""
        cache = self._live_cache()
        state = WarmState(cache, self._history[: cache.len - self.prefix_rows], self.prefix_rows)
        self.cache = None
        return state

    def enable_persistence(self, path: str | os.PathLike) -> int:
        """Keep this chat's KV cache in a sidecar file (engine.kv.persist): once, before any turn. A saved
        conversation there of this model and cache geometry resumes (its tokens and KV rows, its prefix
        included; zero re-prefill); any other file starts over. Returns the resumed positions (0: a fresh
        start). Every turn then appends its new positions. The sidecar holds tokens, not messages: a model's
        own Jinja template re-renders the chat from `messages`, which the caller restores."""
        cache = self._live_cache()
        if self._sidecar is not None or self._history:
            raise RuntimeError("persistence is enabled once, on a conversation that has not had a turn yet")
        fingerprint = kv_persist.model_fingerprint(self.model.file)
        if self._prefix_identity is not None:  # behind cartridges: the file is this model's AND this prefix's
            fingerprint = hashlib.sha256(fingerprint + self._prefix_identity).digest()
        WRITER.flush()  # another conversation over this file may still be writing it
        loaded = kv_persist.load(path, cache, fingerprint)
        if loaded is None:  # a stale or foreign file must not become this conversation's
            kv_persist.reset(path, cache, fingerprint, self.prefix_rows)
        else:
            self._history, self.prefix_rows = loaded.tokens, loaded.prefix_rows
        # A fresh file holds nothing yet: the first save writes from position 0, a declared prefix's rows
        # included (starting at cache.len would leave the prefix unwritten and every later append refused).
        self._sidecar, self._saved = (os.fspath(path), fingerprint), 0 if loaded is None else cache.len
        self._save()
        return 0 if loaded is None else cache.len

    def _save(self) -> None:
        """Bring the sidecar up to the cache: hand the writer the positions from the first one the cache
        replaced or added since the last save. A committed token the turn left unforwarded is forwarded
        first: the sidecar holds positions only."""
        if self._sidecar is None:
            return
        (path, fingerprint), cache = self._sidecar, self.cache
        pending = self._history[cache.len - self.prefix_rows:]
        if pending and cache.len < cache.capacity:
            self.model.forward(pending, cache)
        self.sidecar_error = WRITER.take_failure(path)
        start = 0 if self.sidecar_error else self._saved
        tokens = self._history[: cache.len - self.prefix_rows]
        WRITER.submit(path, kv_persist.snapshot(cache, tokens, fingerprint, self.prefix_rows, start))
        self._saved = cache.len

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
        request = self._user_request(user)
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
        steps of several conversations: engine.service) and sends the step's logits row back."""
        if not len(ids):
            raise ValueError("the prompt is empty")
        return self._stream(_Request([int(t) for t in ids], reuse, on_prefill=on_prefill), cancel, batched)

    def _user_request(self, user: str) -> _Request:
        if isinstance(self.template, Template):
            first = not self._history
            text = self.template.render_turn(user, system=self.system, first=first,
                                             think_off=self.options.think_off)
            ids = self.tokenizer.encode(text, add_special=first and self.prefix_rows == 0)
            return _Request(ids, reuse=False, user=user)
        system = [Message("system", self.system)] if self.system is not None else []
        text = self.template.render_messages([*system, *self.messages, Message("user", user)],
                                             think_off=self.options.think_off)
        return _Request(self.tokenizer.encode(text, add_special=self.prefix_rows == 0), reuse=True, user=user)

    def _stream(self, request: _Request, cancel: threading.Event | None,
                batched: bool = False) -> Generator[str | DecodeStep, np.ndarray | None, None]:
        turn = _Turn(self, request, cancel)
        logits = turn.prefill()
        if turn.done:  # stopped during the prefill
            return
        try:
            # speculation starts once its verify kernels are compiled (the first run compiles them in the
            # background): a reply before that decodes plainly, which gives the same tokens
            if self.options.speculation and self.model.rows_ready(self.cache):
                if self._speculation is None:
                    self._speculation = SpeculativeStream(self.model)
                    for reference in self._references:
                        self._speculation.index.add_reference(reference)
                yield from run_speculative(turn, self._speculation, logits)
                return
            while True:
                text = turn.accept(logits)
                if text:
                    yield text
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

    def _prefill(self, request: _Request, cancel: threading.Event | None) -> tuple[np.ndarray | None, int, int]:
        """Reconcile the cache with the request and feed what it lacks: (last logits, reused, fed). Logits
        None: `cancel` stopped the feed between two slices."""
        cache = self._live_cache()
        cached = cache.len - self.prefix_rows
        if request.reuse:  # logits are not cached state: at least the last prompt token is fed again
            keep = min(common_prefix_len(request.ids, self._history[:cached]), len(request.ids) - 1)
            history = request.ids
        else:
            keep, history = cached, self._history + request.ids
        need = self.prefix_rows + len(history)
        if need > cache.capacity:
            raise ContextFull(f"context full: the conversation needs {need} positions but its context holds "
                              f"{cache.capacity}; start over (reset) or use a larger context")
        cache.truncate(self.prefix_rows + keep)
        self._saved = min(self._saved, cache.len)
        feed = history[keep:]
        logits = self._feed(feed, cancel, request.on_prefill)
        if logits is None:
            if request.reuse:  # what was fed stays: a resend of this render resumes from it
                self._history = list(history[: cache.len - self.prefix_rows])
            else:  # a part of a turn cannot stay under the turns that follow it
                cache.truncate(self.prefix_rows + keep)
            return None, keep, cache.len - self.prefix_rows - keep
        self._history = list(history)
        return logits, keep, len(feed)

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
                self.model.forward(span, self.cache)
                continue
            if len(span) > 1:
                self.model.forward(span[:-1], self.cache)
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


class _Turn:
    """One reply in progress: sampling, stop checks, streaming and statistics for one conversation."""

    def __init__(self, convo: Conversation, request: _Request, cancel: threading.Event | None):
        self.convo, self.request, self.cancel = convo, request, cancel
        self.ids: list[int] = []
        self.reply = b""
        self.parts: list[str] = []
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
        logits, reused, fed = c._prefill(self.request, self.cancel)
        self.stats.prefill_ms = (time.perf_counter() - self._start) * 1e3
        self.stats.reused_tokens, self.stats.prefilled_tokens = reused, fed
        self.stats.prompt_tokens = reused + fed
        if logits is None:
            self.end("cancelled")
        return logits

    def accept(self, logits: np.ndarray) -> str:
        """Sample the next token; return the text it completes (possibly "")."""
        if self.cancelled():
            self.end("cancelled")
            return ""
        token = self.sample(logits)
        stop = self.stop_check(token)
        if stop is not None:
            self.end(stop[0], fired=stop[1])
            return ""
        self.convo._history.append(token)
        text = self.commit(token)
        if spent := self.budget_spent():
            self.end(spent)
        return text

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

    def commit(self, token: int) -> str:
        """Add a token the history already holds to the reply; the text it completes."""
        self.ids.append(token)
        self.convo.reply_tokens = len(self.ids)
        self.reply += self.convo.tokenizer.token_bytes(token)
        text = self.convo._decoder.push(token)
        self.parts.append(text)
        return text

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
        self.done = True
        s = self.stats
        s.generated_tokens = len(self.ids)
        if self._sampled > 1:
            s.decode_tps = (self._sampled - 1) / max(self._last_at - self._first_at, 1e-9)
        text = "".join(self.parts)
        checked = c.options.grammar is not None and reason in ("stop", "length_closed")
        warnings = tuple(map(str, c.options.grammar.check_reply(text))) if checked else ()
        c.last_turn = TurnResult(text, self.ids, reason, fired, s, error, warnings)
        if self.request.user is not None:
            c.messages += [Message("user", self.request.user), Message("assistant", text)]
        c._save()

    def _count_sample(self) -> None:
        now = time.perf_counter()
        if not self._sampled:
            self._first_at = now
            self.stats.ttft_ms = (now - self._start) * 1e3
        self._last_at = now
        self._sampled += 1


def send_batch(conversations: Sequence[Conversation], users: Sequence[str], *,
               sinks: Sequence[Callable[[str], None]] | None = None,
               cancel: threading.Event | None = None) -> list[TurnResult]:
    """One user message on each of several conversations of one model, decoded in lockstep: each step
    forwards one token per live stream in a single weight pass (model.decode_batch). Per stream it behaves
    as send(); `sinks[i]` receives stream i's text pieces. A stream that fails (its render, context, sampler
    or sink) ends with its error recorded while the others go on; only a failing batched forward ends all."""
    return _lockstep(conversations, [c._user_request for c in conversations], users, sinks, cancel)


def send_batch_rendered(conversations: Sequence[Conversation], rendered: Sequence[str], *,
                        sinks: Sequence[Callable[[str], None]] | None = None,
                        cancel: threading.Event | None = None) -> list[TurnResult]:
    """send_batch over full-history renders, each reconciled with its conversation's cache (reuse)."""
    def request(c: Conversation) -> Callable[[str], _Request]:
        return lambda text: _Request(c.tokenizer.encode(text, add_special=c.prefix_rows == 0), reuse=True)

    return _lockstep(conversations, [request(c) for c in conversations], rendered, sinks, cancel)


def _lockstep(convos: Sequence[Conversation], make_requests: Sequence[Callable], prompts: Sequence,
              sinks: Sequence[Callable[[str], None]] | None, cancel: threading.Event | None) -> list[TurnResult]:
    _check_batch(convos, prompts, sinks)
    turns: list[_Turn | None] = [None] * len(convos)
    failed: dict[int, TurnResult] = {}

    def advance(i: int, logits: np.ndarray) -> None:
        try:
            text = turns[i].accept(logits)
            if text and sinks is not None:
                sinks[i](text)
        except Exception as e:  # isolated: a sampler or sink failure ends only this stream
            if not turns[i].done:
                turns[i].end("error", e)

    for i, (convo, make_request, prompt) in enumerate(zip(convos, make_requests, prompts)):
        try:  # turn prefills run per stream
            turn = _Turn(convo, make_request(prompt), cancel)
            logits = turn.prefill()
        except Exception as e:  # isolated: this stream never started
            failed[i] = TurnResult("", [], "error", error=e)
            continue
        turns[i] = turn
        if not turn.done:
            advance(i, logits)
    live = [i for i, t in enumerate(turns) if t is not None and not t.done]
    while live:
        try:
            rows = convos[0].model.decode_batch([turns[i].next_token for i in live],
                                                [convos[i].cache for i in live])
        except BaseException as e:  # shared compute: every live stream ends with it
            for i in live:
                turns[i].end("error", e)
            raise
        for i, row in zip(live, rows):
            advance(i, row)
        live = [i for i in live if not turns[i].done]
    return [failed[i] if t is None else convos[i].last_turn for i, t in enumerate(turns)]


def _check_batch(convos: Sequence[Conversation], prompts: Sequence, sinks) -> None:
    if not convos:
        raise ValueError("a batch needs at least one conversation")
    if len(prompts) != len(convos) or (sinks is not None and len(sinks) != len(convos)):
        raise ValueError("a batch needs one prompt (and one sink, when given) per conversation")
    if len({id(c) for c in convos}) != len(convos):
        raise ValueError("a conversation appears twice in the batch")
    if any(c.model is not convos[0].model for c in convos):
        raise ValueError("every conversation in a batch must use the same model")
    processors = [id(c.sampler.processor) for c in convos if c.sampler.processor is not None]
    if len(set(processors)) != len(processors):
        raise ValueError("conversations in a batch need their own logit processor (it holds one stream's state)")


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if not n:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n
