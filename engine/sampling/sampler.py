"""llama.cpp's sampler chain over one logits row (spec 13.6).

processor -> penalties -> greedy shortcut -> top-k -> temperature softmax -> top-p -> min-p -> one draw.

Temperature <= 0 is a pure argmax that never touches the RNG. Otherwise every sampled token costs exactly
one uniform draw from a generator seeded once, so a stream is a pure function of its seed (chat and
speculation rely on it). With top_k = 0 the nucleus is exact: probabilities carry the full-vocabulary
softmax denominator and the candidate window grows until it holds the requested mass. Work per token is
partial selection over the vocabulary, never a full sort (262k entries for Gemma).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.errors import AllTokensMasked, InvalidSamplerConfig
from engine.sampling.processor import LogitProcessor

NUCLEUS_WINDOW = 256  # first candidate window of the exact nucleus; grows x4 until it holds top_p
_SAMPLE_STRIDE = 64   # top-k shortlist: one vocabulary entry in 64 estimates the selection threshold
_DRAW_BLOCK = 4096    # draws over more entries than this search block sums first


@dataclass(frozen=True)
class SamplerConfig:
    temperature: float = 0.0     # <= 0 selects greedy argmax
    top_k: int = 0               # 0: no top-k; the nucleus is exact over the full vocabulary
    top_p: float = 1.0           # keep the smallest best-first set whose probability reaches top_p
    min_p: float = 0.0           # keep tokens with p >= min_p * p(best); 0 disables
    repeat_penalty: float = 1.0  # llama.cpp penalty_repeat; 1 disables
    freq_penalty: float = 0.0    # llama.cpp penalty_freq: subtracted once per occurrence
    presence_penalty: float = 0.0  # llama.cpp penalty_present: subtracted once per token present
    repeat_last_n: int = 64      # penalty window over the most recent tokens; 0 disables, -1 = all
    seed: int = 0

    def __post_init__(self):
        checks = [
            (not math.isnan(self.temperature), "temperature must be a number"),
            (self.top_k >= 0, f"top_k must be 0 (off) or positive, got {self.top_k}"),
            (0.0 <= self.top_p <= 1.0, f"top_p must be between 0 and 1, got {self.top_p}"),
            (0.0 <= self.min_p <= 1.0, f"min_p must be between 0 and 1, got {self.min_p}"),
            (self.repeat_penalty > 0, f"repeat_penalty must be positive, got {self.repeat_penalty}"),
            (self.repeat_last_n >= -1, f"repeat_last_n must be -1 (all), 0 (off) or positive, got {self.repeat_last_n}"),
            (self.seed >= 0, f"seed must be a non-negative integer, got {self.seed}"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidSamplerConfig(message)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def penalizes(self) -> bool:
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.freq_penalty != 0.0 or self.presence_penalty != 0.0)


# llama.cpp's interactive defaults, for chats (generation without a chat stays greedy unless asked).
CHAT_DEFAULTS = SamplerConfig(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)


class Sampler:
    """One decode stream's sampling state: config, seeded RNG and an optional logit processor.
    Mutable and single-stream (not thread-safe): one per conversation."""

    def __init__(self, config: SamplerConfig | None = None, processor: LogitProcessor | None = None):
        self.config = config or SamplerConfig()
        self.processor = processor
        self._rng = np.random.default_rng(self.config.seed)

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """The next token for one logits row ([vocab] or [1, vocab]); the caller's array is not modified.
        `history` is the stream's committed tokens (penalties and the processor read it)."""
        row, best = self._prepare(logits, history)
        u = None if self.config.greedy else float(self._rng.random())
        token = self._pick(row, best, u)
        if self.processor is not None:
            while (vetted := self.processor.vet(token)) is None:  # refused: the next choice, same draw
                row[token] = -np.inf
                best = int(np.argmax(row))
                if not row[best] > -np.inf:
                    raise AllTokensMasked("the logit processor refused every token the sampler could pick")
                token = self._pick(row, best, u)
            token = vetted
            self.processor.commit(token)
        return token

    def _pick(self, row: np.ndarray, best: int, u: float | None) -> int:
        """The token one draw `u` selects from the prepared row (None: greedy)."""
        if u is None:
            return best
        ids, weights = self._candidates(row, best)
        i = inverse_cdf(weights, u)
        return i if ids is None else int(ids[i])

    def distribution(self, logits: np.ndarray, history: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, probabilities) the next draw would choose from; no draw, no commit."""
        row, best = self._prepare(logits, history)
        if self.config.greedy:
            return np.array([best]), np.ones(1)
        ids, weights = self._candidates(row, best)
        if ids is None:
            ids = np.arange(row.size)
        weights = weights.astype(np.float64)
        return ids, weights / weights.sum()

    def _prepare(self, logits: np.ndarray, history: Sequence[int]) -> tuple[np.ndarray, int]:
        """The row after the processor and penalties, and its argmax."""
        row = np.asarray(logits, dtype=np.float32).reshape(-1)
        if self.processor is not None or (self.config.penalizes and len(history)):
            row = row.copy()
        if self.processor is not None:
            self.processor.process(row, history)
        apply_penalties(row, history, self.config)
        best = int(np.argmax(row))
        if not row[best] > -np.inf:  # all -inf, or NaN
            raise AllTokensMasked("no token can be sampled: every logit is -inf or NaN "
                                  "(did the logit processor mask out every token?)")
        return row, best

    def _candidates(self, row: np.ndarray, best: int) -> tuple[np.ndarray | None, np.ndarray]:
        """Top-k, temperature softmax, top-p, min-p: the kept ids (None = the whole vocabulary in id
        order) and their unnormalized probabilities, best first when truncated."""
        cfg = self.config
        top = row[best]
        scale = np.float32(1.0 / cfg.temperature)
        if cfg.top_k > 0:  # llama.cpp order: truncate, softmax over the kept set, nucleus within it
            ids = top_ids(row, cfg.top_k)
            weights = np.exp((row[ids] - top) * scale)
            if cfg.top_p < 1.0:
                cum = np.cumsum(weights, dtype=np.float64)
                keep = _prefix_len(cum, cfg.top_p * cum[-1])
                ids, weights = ids[:keep], weights[:keep]
        else:
            weights = np.exp((row - top) * scale)  # masked -inf entries become 0
            ids = None
            if cfg.top_p < 1.0:
                ids = nucleus_ids(row, weights, cfg.top_p * float(weights.sum()))  # pairwise f32 sum
                weights = weights[ids]
        if cfg.min_p > 0.0:  # the best token's weight is exactly exp(0) = 1
            keep = np.flatnonzero(weights >= cfg.min_p)
            ids = keep if ids is None else ids[keep]
            weights = weights[keep]
        return ids, weights


def apply_penalties(row: np.ndarray, history: Sequence[int], config: SamplerConfig) -> None:
    """llama_sampler_penalties in place: each distinct token among the last repeat_last_n of history,
    seen `count` times, has its logit divided by repeat_penalty (multiplied when <= 0), then
    count * freq_penalty + presence_penalty subtracted."""
    if not config.penalizes or not len(history):
        return
    window = history if config.repeat_last_n < 0 else history[-config.repeat_last_n:]
    ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    inside = (ids >= 0) & (ids < row.size)
    ids, counts = ids[inside], counts[inside]
    vals = row[ids]
    vals = np.where(vals <= 0, vals * config.repeat_penalty, vals / config.repeat_penalty)
    row[ids] = vals - (counts * config.freq_penalty + config.presence_penalty)


def top_ids(row: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest entries of row, best first (equal values: lower id first)."""
    n = row.size
    ids = _shortlist(row, k) if k < n else np.arange(n)
    if ids.size > k:
        ids = ids[np.argpartition(row[ids], ids.size - k)[ids.size - k:]]
    return ids[np.lexsort((ids, -row[ids]))]


def _shortlist(row: np.ndarray, k: int) -> np.ndarray:
    """Ids that surely include the k largest: those at or above a threshold read off a strided sample.
    One comparison pass replaces a partition of the whole vocabulary; when the sample misjudges (too few
    ids pass), every id is returned and the caller partitions them all."""
    sample = row[::_SAMPLE_STRIDE]
    rank = k // _SAMPLE_STRIDE + 4  # expected survivors ~ (rank + 1) * stride > k
    if sample.size <= rank * 4:  # small vocabulary: a plain partition is as cheap
        return np.arange(row.size)
    threshold = np.partition(sample, sample.size - 1 - rank)[sample.size - 1 - rank]
    ids = np.flatnonzero(row >= threshold)
    return ids if ids.size >= k else np.arange(row.size)


def nucleus_ids(row: np.ndarray, weights: np.ndarray, mass: float) -> np.ndarray:
    """Best-first ids of the smallest set whose weight reaches `mass` (exact: the window of candidates
    grows x4 from NUCLEUS_WINDOW until it holds the mass or the whole vocabulary)."""
    width = NUCLEUS_WINDOW
    while True:
        ids = top_ids(row, min(width, row.size))
        cum = np.cumsum(weights[ids], dtype=np.float64)
        if cum[-1] >= mass or width >= row.size:
            return ids[: _prefix_len(cum, mass)]
        width *= 4


def _prefix_len(cum: np.ndarray, mass: float) -> int:
    """Length of the shortest prefix whose cumulative weight reaches mass (at least 1)."""
    return min(int(np.searchsorted(cum, mass, side="left")) + 1, cum.size)


def inverse_cdf(weights: np.ndarray, u: float) -> int:
    """The index at which the running sum of weights first exceeds u * total, for u in [0, 1); entries
    of weight 0 are never chosen. Long arrays are searched by block sums, then inside one block, instead
    of a cumulative sum over the whole vocabulary."""
    if weights.size <= _DRAW_BLOCK:
        return _search(weights, u)
    starts = np.arange(0, weights.size, _DRAW_BLOCK)
    sums = np.add.reduceat(weights, starts, dtype=np.float64)
    b = _search(sums, u)
    cum = np.cumsum(sums)
    before = cum[b - 1] if b else 0.0
    u_block = min(max((u * cum[-1] - before) / sums[b], 0.0), np.nextafter(1.0, 0.0))
    return int(starts[b]) + _search(weights[starts[b]: starts[b] + _DRAW_BLOCK], u_block)


def _search(weights: np.ndarray, u: float) -> int:
    cum = np.cumsum(weights, dtype=np.float64)
    i = int(np.searchsorted(cum, u * cum[-1], side="right"))
    if i >= cum.size:  # u * total rounded up to the total: the last entry that has weight
        i = int(np.flatnonzero(weights)[-1])
    return i
