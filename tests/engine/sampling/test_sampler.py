"""The sampler chain against hand-computed distributions, seeds, penalties and the exact nucleus."""

import math

import numpy as np
import pytest

from engine.errors import AllTokensMasked, InvalidSamplerConfig
from engine.sampling import Sampler, SamplerConfig
from engine.sampling.sampler import apply_penalties, inverse_cdf, top_ids

LOGITS = np.array([0.1, 0.2, 0.9, 0.3, 0.0], dtype=np.float32)


def softmax(x):
    e = np.exp(np.asarray(x, dtype=np.float64) - np.max(x))
    return e / e.sum()


def rng_state(sampler):
    return sampler._rng.bit_generator.state


def test_greedy_is_argmax_and_never_touches_the_rng():
    s = Sampler()
    before = rng_state(s)
    assert s.sample(LOGITS) == 2
    assert s.sample(LOGITS[None, :]) == 2  # a [1, vocab] row works too
    assert rng_state(s) == before


def test_same_seed_same_draws_and_one_draw_per_token():
    cfg = SamplerConfig(temperature=0.8, top_k=3, seed=42)
    a, b = Sampler(cfg), Sampler(cfg)
    draws = [a.sample(LOGITS) for _ in range(8)]
    assert draws == [b.sample(LOGITS) for _ in range(8)]
    reference = np.random.default_rng(42)
    for _ in range(8):
        reference.random()
    assert rng_state(a) == reference.bit_generator.state
    hot = Sampler(SamplerConfig(temperature=5.0, seed=1))
    assert len({hot.sample(LOGITS) for _ in range(60)}) == 5  # a high temperature reaches every token


def test_full_vocabulary_softmax_at_temperature():
    ids, p = Sampler(SamplerConfig(temperature=0.5)).distribution(LOGITS)
    assert ids.tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(p, softmax(LOGITS / 0.5), rtol=1e-6)


def test_top_k_renormalizes_over_the_kept_set():
    ids, p = Sampler(SamplerConfig(temperature=0.5, top_k=2)).distribution(LOGITS)
    assert ids.tolist() == [2, 3]
    e = math.exp((0.3 - 0.9) / 0.5)
    np.testing.assert_allclose(p, [1 / (1 + e), e / (1 + e)], rtol=1e-6)


@pytest.mark.parametrize("top_k", [0, 4])
@pytest.mark.parametrize("top_p,kept", [(0.79, 2), (0.81, 3), (0.96, 4), (0.0, 1)])
def test_top_p_keeps_the_smallest_prefix_reaching_the_mass(top_k, top_p, kept):
    logits = np.log(np.array([0.05, 0.5, 0.15, 0.3], dtype=np.float32))
    ids, p = Sampler(SamplerConfig(temperature=1.0, top_k=top_k, top_p=top_p)).distribution(logits)
    order = [1, 3, 2, 0][:kept]
    assert ids.tolist() == order
    full = np.array([0.05, 0.5, 0.15, 0.3])
    np.testing.assert_allclose(p, full[order] / full[order].sum(), rtol=1e-5)


def test_min_p_keeps_tokens_near_the_best():
    logits = np.log(np.array([0.05, 0.5, 0.15, 0.3], dtype=np.float32))
    ids, p = Sampler(SamplerConfig(temperature=1.0, min_p=0.25)).distribution(logits)
    assert ids.tolist() == [1, 2, 3]  # p >= 0.125; the unsorted full vocabulary keeps id order
    np.testing.assert_allclose(p, np.array([0.5, 0.15, 0.3]) / 0.95, rtol=1e-5)
    ids, _ = Sampler(SamplerConfig(temperature=1.0, top_p=0.9, min_p=0.25)).distribution(logits)
    assert ids.tolist() == [1, 3, 2]  # after a nucleus: best first


@pytest.mark.parametrize("spread,top_p", [(8.0, 0.9), (0.05, 0.9), (0.05, 0.999), (3.0, 0.5)])
def test_exact_nucleus_over_a_gemma_sized_vocabulary(spread, top_p):
    """The kept set reaches top_p of the full-vocabulary mass and dropping its last token falls short;
    a flat distribution (spread 0.05) makes the window grow far past its first 256 candidates."""
    logits = (np.random.default_rng(0).standard_normal(262_144) * spread).astype(np.float32)
    ids, p = Sampler(SamplerConfig(temperature=1.0, top_p=top_p)).distribution(logits)
    full = softmax(logits)
    mass = full[ids].sum()
    assert mass >= top_p - 1e-6
    assert mass - full[ids[-1]] < top_p + 1e-6
    assert full[ids].min() >= np.delete(full, ids).max()  # the best tokens, nothing skipped
    assert np.all(np.diff(full[ids]) <= 0)
    np.testing.assert_allclose(p, full[ids] / mass, rtol=1e-4)
    if spread < 1:
        assert ids.size > 256


def test_draw_frequencies_follow_the_distribution():
    cfg = SamplerConfig(temperature=0.7, top_k=4, top_p=0.95, seed=3)
    s = Sampler(cfg)
    ids, p = s.distribution(LOGITS)
    n = 4000
    counts = np.bincount([s.sample(LOGITS) for _ in range(n)], minlength=5)
    for i, q in zip(ids, p):
        assert abs(counts[i] / n - q) < 4 * math.sqrt(q * (1 - q) / n)
    assert counts[np.setdiff1d(np.arange(5), ids)].sum() == 0


def test_penalties_follow_llama_cpp():
    cfg = SamplerConfig(repeat_penalty=1.5, freq_penalty=0.1, presence_penalty=0.2, repeat_last_n=3)
    row = np.array([2.0, -1.0, 0.5, 3.0], dtype=np.float32)
    apply_penalties(row, [0, 1, 1, 3], cfg)  # window: the last 3 tokens, 1 twice and 3 once
    np.testing.assert_allclose(row, [2.0, -1.0 * 1.5 - (2 * 0.1 + 0.2), 0.5, 3.0 / 1.5 - (0.1 + 0.2)],
                               rtol=1e-6)
    everything = np.array([2.0, -1.0, 0.5, 3.0], dtype=np.float32)
    apply_penalties(everything, [0, 1, 1, 3], SamplerConfig(repeat_penalty=2.0, repeat_last_n=-1))
    np.testing.assert_allclose(everything, [1.0, -2.0, 0.5, 1.5])
    untouched = np.array([2.0, -1.0], dtype=np.float32)
    apply_penalties(untouched, [0, 1], SamplerConfig(repeat_penalty=2.0, repeat_last_n=0))
    assert untouched.tolist() == [2.0, -1.0]


def test_penalties_steer_greedy_without_touching_the_callers_logits():
    logits = LOGITS.copy()
    s = Sampler(SamplerConfig(repeat_penalty=10.0))
    assert s.sample(logits, history=[2]) == 3  # 0.9 / 10 falls below 0.3
    assert np.array_equal(logits, LOGITS)


def test_top_ids_matches_a_full_sort():
    rng = np.random.default_rng(1)
    row = rng.standard_normal(300_000).astype(np.float32)
    for k in (1, 40, 256, 5000):
        assert top_ids(row, k).tolist() == np.argsort(-row, kind="stable")[:k].tolist()
    ties = np.array([1.0, 3.0, 3.0, 2.0, 3.0], dtype=np.float32)
    assert top_ids(ties, 4).tolist() == [1, 2, 4, 3]


def test_inverse_cdf_skips_zero_weights_and_agrees_across_block_sizes():
    w = np.array([0.0, 1.0, 0.0, 3.0, 0.0], dtype=np.float32)
    assert [inverse_cdf(w, u) for u in (0.0, 0.2, 0.25, 0.9, np.nextafter(1.0, 0.0))] == [1, 1, 3, 3, 3]
    big = np.random.default_rng(2).random(50_000).astype(np.float32)
    big[::3] = 0
    cum = np.cumsum(big, dtype=np.float64)
    for u in np.random.default_rng(3).random(200):
        assert inverse_cdf(big, u) == int(np.searchsorted(cum, u * cum[-1], side="right"))


def test_everything_masked_is_a_clear_error():
    with pytest.raises(AllTokensMasked, match="mask"):
        Sampler().sample(np.full(4, -np.inf, dtype=np.float32))
    with pytest.raises(AllTokensMasked):
        Sampler(SamplerConfig(temperature=1.0)).sample(np.array([0.0, np.nan], dtype=np.float32))


@pytest.mark.parametrize("bad", [dict(top_k=-1), dict(top_p=1.5), dict(min_p=-0.1), dict(repeat_penalty=0.0),
                                 dict(repeat_last_n=-2), dict(seed=-1), dict(temperature=float("nan"))])
def test_invalid_settings_are_rejected(bad):
    with pytest.raises(InvalidSamplerConfig):
        SamplerConfig(**bad)
