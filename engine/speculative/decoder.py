"""The lossless speculative decoder (spec 13.9.1).

Every draft source is deterministic (a one-hot proposal), so rejection sampling reduces to this: verify
[last committed token, draft...] in one forward, then for each row in order run the FULL sampling pipeline
(processor, penalties, top-k/top-p/min-p, temperature, one draw) on that row's target logits, conditioned on
the tokens committed so far; accept while the sampled token equals the draft; the first mismatch's sample is
the correction; a fully accepted draft yields one more (bonus) token from the last row. Greedy is the same
path (the sampler's argmax). Token ids are compared, never probabilities, and exactly one sample (one RNG
draw when sampling) is taken per committed token, as in a plain run. A stop token ends the row loop: it is
reported and not committed, like the plain loop's. Hence, given verify rows equal to the one-token forwards,
the committed stream, the sampler's RNG and the processor's state are those of a plain run, token for token.

State: the cache holds every committed token but the last (the one the next verify feeds first) -- after a
stop, every committed token. `bootstrap` commits the first token from the prefill's logits; `step` needs
the state the previous call left and raises InvalidDecodeState otherwise. Rows past the committed tokens are
dropped with `truncate`, on error paths too, so an exception leaves a state the next step can continue from.
Sources observe every committed token; the cost gate only decides whether a step drafts.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from engine.errors import InvalidDecodeState, InvalidSpeculationConfig, SpeculativeError
from engine.sampling.sampler import Sampler, top_ids
from engine.speculative.gate import CostGate
from engine.speculative.source import DraftSource, TopKRow, last_forced, match_len, truncate_pending, wants_top_k
from engine.speculative.target import VerifyTarget


@dataclass(frozen=True)
class SpecOptions:
    max_draft: int = 16
    min_draft: int = 2          # shorter drafts are not verified (the step is a plain one), unless forced
    topk_feedback: int = 8      # candidates per verified position for sources that consume them
    stop_tokens: frozenset[int] = frozenset()

    def __post_init__(self):
        if not 1 <= self.min_draft <= self.max_draft:
            raise InvalidSpeculationConfig(f"need 1 <= min_draft <= max_draft (got {self.min_draft}, "
                                           f"{self.max_draft})")
        if self.topk_feedback < 0:
            raise InvalidSpeculationConfig(f"topk_feedback must be >= 0, got {self.topk_feedback}")


@dataclass
class Stats:
    steps: int = 0           # bootstrap and decode steps
    spec_steps: int = 0      # steps that verified a draft
    fallback_steps: int = 0  # speculation allowed, no draft long enough: a plain step
    disabled_steps: int = 0  # the cost gate held speculation off: a plain step
    drafted: int = 0
    accepted: int = 0
    rejected_steps: int = 0  # verify steps whose draft met a mismatch (the correction token)
    bonus: int = 0           # fully accepted drafts' extra token
    committed: int = 0

    def tokens_per_step(self) -> float:
        return self.committed / self.steps if self.steps else 0.0

    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def summary(self) -> str:
        return (f"{self.committed} tokens in {self.steps} steps ({self.tokens_per_step():.2f}/step); "
                f"{self.spec_steps} verified drafts, {self.fallback_steps} fallback and {self.disabled_steps} "
                f"gated-off plain steps; drafted {self.drafted}, accepted {self.accepted} "
                f"({100 * self.acceptance_rate():.0f}%), {self.bonus} bonus")


@dataclass(frozen=True)
class StepResult:
    committed: tuple[int, ...]
    stop_token: int | None = None  # the sampled stop token that ended the step (not committed)

    @property
    def stopped(self) -> bool:
        return self.stop_token is not None


@dataclass
class _Step:
    """One call in progress: what the caller must see even when it raises."""
    base: int
    draft: list[int]
    tokens: list[int]      # row inputs: the last committed token, then the draft
    verified: bool         # a draft went to verify (a speculative step)
    committed: list[int] = field(default_factory=list)
    sampled: int = 0       # rows sampled; their input tokens are all committed
    stop: int | None = None


class SpeculativeDecoder:
    def __init__(self, target: VerifyTarget, sampler: Sampler, source: DraftSource, *, vocab_size: int,
                 options: SpecOptions | None = None, gate: CostGate | None = None,
                 clock: Callable[[], float] | None = None):
        self.options = options or SpecOptions()
        if wants_top_k(source) and self.options.topk_feedback == 0:
            raise InvalidSpeculationConfig("the draft source consumes top-K feedback but topk_feedback is 0")
        if vocab_size < 1:
            raise InvalidSpeculationConfig(f"vocab_size must be >= 1, got {vocab_size}")
        self.target, self.sampler, self.source = target, sampler, source
        self.vocab_size = vocab_size
        self.gate = gate
        self.clock = clock  # with a gate, measured verify times rescale its cost table
        self.stats = Stats()
        self._topk = wants_top_k(source)
        self._offset: int | None = None  # cache positions before history[0]; set by bootstrap

    # --- the two entries -------------------------------------------------------------------------

    def bootstrap(self, logits: np.ndarray, history: list[int], *,
                  is_stop: Callable[[int], bool] | None = None,
                  sink: Callable[[int], None] | None = None) -> StepResult:
        """Commit the first token from the prefill's logits ([vocab], or [m, vocab] of which the last row
        counts). The cache must hold the whole history (the prefill fed every pending token); appends to
        `history`."""
        base = len(self.target)
        if base < len(history):
            raise InvalidDecodeState(f"bootstrap needs the cache to hold the whole history: it holds {base} "
                                     f"positions for {len(history)} history tokens")
        self._offset = base - len(history)
        step = _Step(base, [], [], verified=False)
        rows = np.asarray(logits)
        rows = rows.reshape(1, -1) if rows.ndim == 1 else rows[-1:]
        try:
            self._sample_rows(step, rows, history, is_stop, sink)
        finally:
            self.source.observe(step.committed)
            self.stats.steps += 1
            self.stats.committed += len(step.committed)
        return StepResult(tuple(step.committed), step.stop)

    def step(self, history: list[int], *, limit: int | None = None,
             is_stop: Callable[[int], bool] | None = None,
             sink: Callable[[int], None] | None = None) -> StepResult:
        """One decode iteration: commits at least one token, or reports the stop token that ends the reply.
        `limit` caps the tokens committed (the reply's remaining budget); `is_stop(token)` adds the caller's
        stop rules (checked, in order, after every earlier token of the step was passed to `sink`); `sink`
        receives each committed token. Appends the committed tokens to `history`."""
        limit = self._limit(limit)
        self._check_state(history)
        base = len(self.target)
        room = self.target.capacity - base  # rows this verify can feed
        draft, verified = self._draft(history, min(limit, room) - 1)
        step = _Step(base, draft, [history[-1], *draft], verified)
        try:
            rows = self._verify(step.tokens)
            self._sample_rows(step, rows, history, is_stop, sink)
        except BaseException:
            self._settle(step, None)
            raise
        self._settle(step, rows)
        return StepResult(tuple(step.committed), step.stop)

    # --- pieces ----------------------------------------------------------------------------------

    def _limit(self, limit: int | None) -> int:
        if limit is None:
            return 1 << 62
        if limit < 1:
            raise InvalidSpeculationConfig(f"a step's limit must be >= 1 token, got {limit}")
        return limit

    def _check_state(self, history: Sequence[int]) -> None:
        if self._offset is None:
            raise InvalidDecodeState("no token was committed yet: call bootstrap() with the prefill's logits first")
        expected = self._offset + len(history) - 1  # after a stop, or a prefill, the cache holds one more
        if len(self.target) != expected:
            raise InvalidDecodeState(f"the cache holds {len(self.target)} positions but a step over {len(history)} "
                                     f"history tokens needs {expected} (all committed tokens but the last); "
                                     f"after a stop token or a new prefill, call bootstrap()")

    def _draft(self, history: Sequence[int], cap: int) -> tuple[list[int], bool]:
        """The draft this step verifies (clamped to the budget and the vocabulary) and whether there is one;
        the stats learn which kind of plain step it is otherwise."""
        match = match_len(self.source) if self.gate is not None else 0
        if self.gate is not None and not self.gate.allow(match):
            self.stats.disabled_steps += 1
            return [], False
        # The gate's budget bounds uncertain drafts; a forced one (the grammar allows no other tokens) may run
        # to the full budget, so the source is asked for that and an unforced draft is cut to the gate's.
        full = min(cap, self.options.max_draft)
        if full < 1:
            self.stats.fallback_steps += 1
            return [], False
        suggestion = self.source.suggest(history, full)
        forced = last_forced(self.source)
        limit = full if forced or self.gate is None else min(full, self.gate.budget(match))
        raw = [] if suggestion is None else list(itertools.islice(iter(suggestion), limit + 1))
        draft = []
        for t in raw[:limit]:
            try:
                t = operator.index(t)
            except TypeError:
                break
            if not 0 <= t < self.vocab_size:
                break
            draft.append(t)
        # A forced token (the grammar allows no other) is all but sure to be accepted: a two-row verify of it
        # commits two tokens for little more than one step's cost, so it is worth a verify on its own.
        if len(draft) < (1 if forced else self.options.min_draft):
            if raw:
                truncate_pending(self.source, 0)
            self.stats.fallback_steps += 1
            return [], False
        if len(draft) < len(raw):
            truncate_pending(self.source, len(draft))
        return draft, True

    def _verify(self, tokens: list[int]) -> np.ndarray:
        start = self.clock() if self.clock is not None else 0.0
        rows = np.asarray(self.target.verify(tokens))
        if rows.ndim != 2 or rows.shape[0] != len(tokens):
            raise SpeculativeError(f"verify returned logits of shape {rows.shape} for {len(tokens)} tokens; "
                                   f"expected [{len(tokens)}, vocab]")
        if self.clock is not None and self.gate is not None:
            self.gate.record_time(len(tokens), self.clock() - start)
        return rows

    def _sample_rows(self, step: _Step, rows: np.ndarray, history: list[int],
                     is_stop: Callable[[int], bool] | None, sink: Callable[[int], None] | None) -> None:
        stop_tokens = self.options.stop_tokens
        draft = step.draft
        for i in range(len(draft) + 1):
            token = self.sampler.sample(rows[i], history)
            step.sampled += 1
            if token in stop_tokens or (is_stop is not None and is_stop(token)):
                step.stop = token
                return
            history.append(token)
            step.committed.append(token)
            if sink is not None:
                sink(token)
            if i == len(draft) or token != draft[i]:
                return

    def _settle(self, step: _Step, rows: np.ndarray | None) -> None:
        """Drop the rows past the committed tokens; feed the sources, the gate and the stats."""
        stopped = step.stop is not None
        self.target.truncate(step.base + len(step.committed) + stopped)
        if rows is not None and self._topk:
            k = self.options.topk_feedback
            self.source.observe_top_k([TopKRow(step.tokens[i], tuple(top_ids(rows[i], k).tolist()))
                                       for i in range(step.sampled)])
        self.source.observe(step.committed)
        s = self.stats
        s.steps += 1
        s.committed += len(step.committed)
        if not step.verified:
            return
        accepted = 0
        for c, d in zip(step.committed, step.draft):
            if c != d:
                break
            accepted += 1
        s.spec_steps += 1
        s.drafted += len(step.draft)
        s.accepted += accepted
        if accepted < len(step.draft) and len(step.committed) > accepted:
            s.rejected_steps += 1
        if len(step.committed) == len(step.draft) + 1:
            s.bonus += 1
        if rows is not None and self.gate is not None:
            self.gate.record_step(len(step.tokens), len(step.committed) + stopped, len(step.draft), accepted)
