"""A fake deterministic model and the two decode loops (plain and speculative) that must agree.

The model's logits are a function of the whole context: a fixed bigram table (so streams repeat and
drafts get accepted), noise seeded by a hash of the context (so no two positions share logits), and a
stop-token boost at one context in stop_one_in (so turns end on stop tokens). Verifying m tokens is therefore
exactly m one-token forwards, and a cache that kept a wrong row would change every later logit.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from engine.errors import KvCacheOverflow
from engine.sampling.sampler import Sampler
from engine.speculative.decoder import SpeculativeDecoder

STOP = 5


class FakeModel:
    def __init__(self, vocab: int = 48, seed: int = 0, noise: float = 0.5, stop_one_in: int = 29):
        self.vocab = vocab
        self.table = (np.random.default_rng(seed).normal(size=(vocab, vocab)) * 3.0).astype(np.float32)
        self.table[:, STOP] = -8.0  # only the boost stops a turn
        self.noise = noise
        self.stop_one_in = stop_one_in

    def logits(self, context: Sequence[int]) -> np.ndarray:
        seed = zlib.crc32(np.asarray(context, dtype=np.int64).tobytes())
        row = self.table[context[-1]] + self.noise * np.random.default_rng(seed).normal(size=self.vocab)
        if seed % self.stop_one_in == 0:
            row[STOP] = 30.0
        return row.astype(np.float32)


class FakeTarget:
    """A "KV cache" that holds the fed tokens; verify feeds at its end. `fail_calls` makes those verify
    calls (1-based, prefills not counted) raise half-way through feeding, after writing some positions."""

    def __init__(self, model: FakeModel, capacity: int = 1 << 20, fail_calls: Sequence[int] = ()):
        self.model = model
        self.capacity = capacity
        self.positions: list[int] = []
        self.calls = 0
        self.fail_calls = set(fail_calls)
        self.rows_fed = 0

    def __len__(self) -> int:
        return len(self.positions)

    def verify(self, tokens: Sequence[int]) -> np.ndarray:
        self.calls += 1
        return self.feed(tokens, fail=self.calls in self.fail_calls)

    def feed(self, tokens: Sequence[int], fail: bool = False) -> np.ndarray:
        rows = []
        for i, t in enumerate(tokens):
            if len(self.positions) >= self.capacity:
                raise KvCacheOverflow(f"fake cache full at {self.capacity}")
            self.positions.append(int(t))
            self.rows_fed += 1
            rows.append(self.model.logits(self.positions))
            if fail and i == len(tokens) // 2:
                raise RuntimeError(f"verify call {self.calls} failed")
        return np.stack(rows)

    def truncate(self, keep_len: int) -> None:
        del self.positions[keep_len:]


class CountingRng:
    """Wraps a sampler's generator to count its draws (the sampler takes exactly `random()` per draw)."""

    def __init__(self, rng):
        self.rng = rng
        self.draws = 0

    def random(self):
        self.draws += 1
        return self.rng.random()


def counted(sampler: Sampler) -> CountingRng:
    sampler._rng = CountingRng(sampler._rng)
    return sampler._rng


@dataclass
class Run:
    replies: list[list[int]] = field(default_factory=list)
    ends: list[str] = field(default_factory=list)  # stop | stop_sequence | length | context
    history: list[int] = field(default_factory=list)
    sampled: list[list[int]] = field(default_factory=list)  # per turn: replies plus the stop token sampled
    draws: int = 0
    failed_verifies: int = 0


def stop_rule(stop_sequence: tuple[int, int] | None, reply: list[int]) -> Callable[[int], str | None]:
    def check(token: int) -> str | None:
        if token == STOP:
            return "stop"
        if stop_sequence is not None and reply[-1:] == [stop_sequence[0]] and token == stop_sequence[1]:
            return "stop_sequence"
        return None
    return check


def prefill(target: FakeTarget, history: list[int], prompt: Sequence[int]) -> np.ndarray:
    """Feed what the cache lacks (a length-ended turn's last token, then the prompt); history takes it."""
    history.extend(prompt)
    return target.feed(history[len(target):])[-1]


def plain_run(model, sampler: Sampler, prompts, *, max_tokens=40, capacity=1 << 20,
              stop_sequence=None) -> Run:
    """The reference: sample -> stop check -> commit -> forward one token, like Conversation."""
    target, run = FakeTarget(model, capacity), Run()
    rng = counted(sampler)
    for prompt in prompts:
        logits = prefill(target, run.history, prompt)
        reply, sampled = [], []
        check = stop_rule(stop_sequence, reply)
        while True:
            token = sampler.sample(logits, run.history)
            sampled.append(token)
            end = check(token)
            if end:
                break
            run.history.append(token)
            reply.append(token)
            if len(reply) >= max_tokens:
                end = "length"
                break
            if len(target) >= target.capacity:
                end = "context"
                break
            logits = target.verify([token])[-1]
        run.replies.append(reply)
        run.sampled.append(sampled)
        run.ends.append(end)
    run.draws = rng.draws
    return run


def spec_run(model, sampler: Sampler, prompts, make_decoder: Callable[[FakeTarget, Sampler], SpeculativeDecoder],
             *, max_tokens=40, capacity=1 << 20, stop_sequence=None, fail_calls=(), on_turn=None,
             on_step=None) -> tuple[Run, SpeculativeDecoder]:
    """The same turns through the decoder: bootstrap from the prefill's logits, then steps. A failing verify
    is retried by the next step (the decoder must leave a state it can continue from)."""
    target, run = FakeTarget(model, capacity, fail_calls), Run()
    rng = counted(sampler)
    decoder = make_decoder(target, sampler)
    for t, prompt in enumerate(prompts):
        logits = prefill(target, run.history, prompt)
        if on_turn is not None:
            on_turn(t, decoder, run.history)
        reply: list[int] = []
        check = stop_rule(stop_sequence, reply)

        def is_stop(token):
            return check(token) is not None

        result = decoder.bootstrap(logits, run.history, is_stop=is_stop, sink=reply.append)
        sampled = list(result.committed)
        while not result.stopped and len(reply) < max_tokens and len(target) < target.capacity:
            assert len(target) == len(run.history) - 1  # every committed token but the last is cached
            try:
                result = decoder.step(run.history, limit=max_tokens - len(reply), is_stop=is_stop,
                                      sink=reply.append)
            except RuntimeError:
                assert len(target) == len(run.history) - 1  # the failed verify's rows were dropped
                run.failed_verifies += 1
                continue
            sampled += result.committed
            if on_step is not None:
                on_step(result, target, run.history)
        if result.stopped:
            assert len(target) == len(run.history)  # the stop token's input was forwarded, like plain
            sampled.append(result.stop_token)
            end = check(result.stop_token)  # the reply has not changed since the stop was sampled
        else:
            end = "length" if len(reply) >= max_tokens else "context"
        run.replies.append(reply)
        run.sampled.append(sampled)
        run.ends.append(end)
    run.draws = rng.draws
    return run, decoder
