"""Model-level loops over token ids: teacher-forced scoring, greedy and sampled generation."""

from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import numpy as np

from engine.kv.cache import KvDtype
from engine.models.model import UBATCH, Model
from engine.models.validate import check_logits, check_token_ids
from engine.sampling import Sampler
from engine.speculative import SpecOptions, SpeculativeStream, Stats
from engine.speculative.constrained import grammar_aware


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest entries of each row, best first: (ids, values)."""
    k = min(k, logits.shape[-1])
    idx = np.argpartition(-logits, k - 1, axis=-1)[..., :k]
    vals = np.take_along_axis(logits, idx, axis=-1)
    order = np.argsort(-vals, axis=-1, kind="stable")
    return np.take_along_axis(idx, order, axis=-1), np.take_along_axis(vals, order, axis=-1)


# How teacher_forced feeds the ids: the prefill path (a prompt), one row-wise call per chunk (a verify),
# or one token at a time (decode). "rows" and "decode" give identical logits.
PATHS = ("prefill", "rows", "decode")


def teacher_forced(model: Model, ids: Sequence[int], kv: KvDtype | str = KvDtype.F16,
                   chunk: int = UBATCH, path: str = "prefill") -> Iterator[np.ndarray]:
    """Logits after every prefix of ids, one [n, vocab] array per chunk (so a long text never holds
    all of its logits at once)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
    check_token_ids(ids, model.vocab_size)
    cache = model.new_cache(len(ids), kv)
    for start in range(0, len(ids), chunk):
        span = ids[start : start + chunk]
        if path == "prefill":
            logits = model.forward_all(span, cache)
        elif path == "rows":
            logits = model.forward_rows(span, cache)
        else:
            logits = np.stack([model.forward([t], cache) for t in span])
        check_logits(logits, start)
        yield logits


def greedy(model: Model, prompt: Sequence[int], max_tokens: int, stop_ids: Iterable[int] = (),
           kv: KvDtype | str = KvDtype.F16, capacity: int | None = None) -> Iterator[int]:
    """Yield greedily decoded ids (argmax, no sampling); a stop id ends generation and is yielded."""
    return sample(model, prompt, max_tokens, Sampler(), stop_ids, kv, capacity)


def sample(model: Model, prompt: Sequence[int], max_tokens: int, sampler: Sampler,
           stop_ids: Iterable[int] = (), kv: KvDtype | str = KvDtype.F16,
           capacity: int | None = None) -> Iterator[int]:
    """Yield the ids `sampler` chooses after the prompt; a stop id ends generation and is yielded. A
    grammar's reply closes within max_tokens (engine.sampling.budget)."""
    check_token_ids(prompt, model.vocab_size)
    _plan_budget(sampler, max_tokens)
    stops = set(stop_ids)
    cache = model.new_cache(capacity or len(prompt) + max_tokens, kv)
    history = list(prompt)
    logits = model.forward(prompt, cache)
    for _ in range(max_tokens):
        check_logits(logits, cache.len - 1)
        tok = sampler.sample(logits, history)
        yield tok
        if tok in stops or cache.len >= cache.capacity:
            return
        history.append(tok)
        logits = model.forward([tok], cache)


def sample_speculative(model: Model, prompt: Sequence[int], max_tokens: int, sampler: Sampler,
                       stop_ids: Iterable[int] = (), kv: KvDtype | str = KvDtype.F16, capacity: int | None = None,
                       *, stats: Stats | None = None) -> Iterator[int]:
    """`sample`, decoded speculatively (engine.speculative) with drafts from the prompt and the output so
    far: the same ids, fewer forwards. `stats`, when given, collects the decoder's counts."""
    if max_tokens < 1:
        return
    _plan_budget(sampler, max_tokens)
    cache = model.new_cache(capacity or len(prompt) + max_tokens, kv)
    history = list(prompt)
    stream = SpeculativeStream(model, SpecOptions(stop_tokens=frozenset(stop_ids)))
    stream.index.sync(history)
    decoder = stream.decoder(cache, sampler, grammar_aware(stream.index, sampler.processor))
    if stats is not None:
        decoder.stats = stats
    result = decoder.bootstrap(model.forward(prompt, cache), history)
    produced = 0
    while True:
        yield from result.committed
        produced += len(result.committed)
        if result.stopped:
            yield result.stop_token
            return
        if produced >= max_tokens or cache.len >= cache.capacity:
            return
        result = decoder.step(history, limit=max_tokens - produced)


def _plan_budget(sampler: Sampler, max_tokens: int) -> None:
    if sampler.processor is not None:
        sampler.processor.set_budget(max_tokens)
