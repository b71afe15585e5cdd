"""Experts streamed from disk (engine.models.expert_store): streaming changes when bytes arrive, never the numbers
(bitwise equal to the mapped experts through prefill, decode and row-wise verify, whatever the budget and the
policy); the cache keeps what its policy says; a file that changes under the stream is a clear error."""

import os
import shutil

import numpy as np
import pytest

from engine.gguf.reader import open_gguf
from engine.models import load_model
from engine.models.expert_replay import replay, sweep
from engine.models.expert_store import (
    USAGE_SUFFIX, ExpertStore, ExpertStoreError, StreamOptions, Trace, load_usage,
)
from tests.moe_models import N_EXPERT, N_LAYERS, TOKENS, write_moe_model

# one expert of the q4_k variant: gate and up 256 rows of 256 Q4_K weights, down the same
EXPERT_BYTES = 3 * 256 * 144


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "moe-q4_k.gguf"
    write_moe_model(path, "q4_k")
    return path


def _run(model) -> list[np.ndarray]:
    """Logits of a prefill, three decode steps and a four-row verify."""
    cache = model.new_cache(64)
    out = [model.forward_all(TOKENS[:20], cache)]
    out += [model.forward([t], cache)[None] for t in TOKENS[20:23]]
    out.append(model.forward_rows(TOKENS[23:27], cache))
    return out


@pytest.fixture(scope="module")
def mapped(moe_path):
    return _run(load_model(moe_path))


def _write_usage(model_path, counts: dict[int, list[int]]) -> None:
    with open(str(model_path) + USAGE_SUFFIX, "wb") as f:
        np.savez(f, **{str(layer): np.array(c, np.int64) for layer, c in counts.items()})


@pytest.mark.parametrize("slots, policy, pin_share, prefetch", [
    (1, "heat", 0, False), (3, "heat", 0, False), (3, "lru", 0, False), (N_EXPERT, "heat", 0, False),
    (4, "heat", 0.5, False), (3, "heat", 0, True), (1, "lru", 0, True)])
def test_streamed_experts_give_the_mapped_bits(moe_path, mapped, slots, policy, pin_share, prefetch):
    _write_usage(moe_path, {0: [0, 50, 0, 0, 0, 0, 90, 0], 1: [40, 0, 0, 30, 0, 0, 0, 0]})
    model = load_model(moe_path, experts=StreamOptions(cache_bytes=slots * N_LAYERS * EXPERT_BYTES, policy=policy,
                                                       pin_share=pin_share, prefetch=prefetch))
    assert model.expert_store.stats.pinned == (4 if pin_share else 0)
    for got, want in zip(_run(model), mapped):
        np.testing.assert_array_equal(got, want)
    stats = model.expert_store.stats
    assert stats.misses >= N_LAYERS  # each layer read at least one expert
    assert stats.bytes_read == (stats.misses + stats.prefetched) * EXPERT_BYTES
    if prefetch:  # layer 0's decode and verify steps read ahead for layer 1
        assert stats.prefetched > 0 and 0 <= stats.prefetch_used <= stats.prefetched
    if slots == N_EXPERT:  # a cache holding every expert reads each at most once
        assert stats.misses <= N_LAYERS * N_EXPERT
        assert stats.hits > 0


def test_a_warm_cache_reads_nothing_again(moe_path):
    model = load_model(moe_path, experts=StreamOptions(cache_bytes=N_EXPERT * N_LAYERS * EXPERT_BYTES))
    _run(model)
    stats = model.expert_store.stats
    read, misses = stats.bytes_read, stats.misses
    _run(model)
    assert (stats.bytes_read, stats.misses) == (read, misses)
    assert stats.hit_rate > 0.5


def _stacks(moe_path, layer=0):
    with open_gguf(moe_path) as file:
        return [file.tensor(f"blk.{layer}.ffn_{w}_exps.weight") for w in ("gate", "up", "down")]


def _layer(moe_path, capacity, policy="heat"):
    store = ExpertStore(moe_path, StreamOptions(cache_bytes=capacity * EXPERT_BYTES, policy=policy), layers=1)
    return store, store.layer(0, *_stacks(moe_path), N_EXPERT)


def test_pins_from_earlier_runs_stay_and_a_flat_usage_pins_nothing(moe_path, tmp_path):
    copy = tmp_path / "moe.gguf"
    shutil.copyfile(moe_path, copy)
    _write_usage(copy, {0: [0, 50, 0, 0, 0, 0, 90, 0], 1: [10] * N_EXPERT})
    store = ExpertStore(copy, StreamOptions(cache_bytes=4 * EXPERT_BYTES, pin_share=0.5), layers=1)
    skewed, flat = (store.layer(i, *_stacks(copy, i), N_EXPERT) for i in (0, 1))
    assert list(skewed.pins) == [6, 1] and flat.pins.size == 0
    assert (store.stats.pinned, store.stats.pins_declined) == (2, 1)
    skewed.acquire(np.array([6, 1]), np.array([1, 1]))
    for e in (0, 2, 3, 4, 5, 7, 0, 2):  # hotter by far than the pins now: they stay all the same
        skewed.acquire(np.array([e]), np.array([50]))
    assert {6, 1} <= set(skewed.held())
    skewed.acquire(np.array([0, 2, 3, 4]), np.array([1, 1, 1, 1]))  # a call needing every slot takes the pins'
    assert skewed.held() == [0, 2, 3, 4]


def test_each_run_adds_its_usage_to_the_file_beside_the_model(moe_path, tmp_path):
    copy = tmp_path / "moe.gguf"
    shutil.copyfile(moe_path, copy)
    model = load_model(copy, experts=StreamOptions(cache_bytes=2 * N_LAYERS * EXPERT_BYTES))
    _run(model)
    store = model.expert_store
    routed = {layer: counts.copy() for layer, counts in store.usage.items()}
    assert sum(c.sum() for c in routed.values()) > 0
    store.save_usage()
    store.save_usage()
    saved = load_usage(str(copy) + USAGE_SUFFIX)
    assert set(saved) == set(routed)
    for layer, counts in routed.items():
        np.testing.assert_array_equal(saved[layer], 2 * counts)
    (tmp_path / ("moe.gguf" + USAGE_SUFFIX)).write_bytes(b"damaged")
    assert load_usage(str(copy) + USAGE_SUFFIX) == {}  # pins nothing, fails nothing


def test_heat_keeps_the_expert_more_rows_went_to_and_lru_the_latest(moe_path):
    for policy, kept in (("heat", [0, 2]), ("lru", [1, 2])):
        _, layer = _layer(moe_path, 2, policy)
        layer.acquire(np.array([0]), np.array([10]))  # hot
        layer.acquire(np.array([1]), np.array([1]))   # cold, but later
        layer.acquire(np.array([2]), np.array([1]))   # evicts one of them
        assert layer.held() == kept, policy


def test_slots_hold_the_files_bytes_of_their_expert(moe_path):
    store, layer = _layer(moe_path, 2)
    slots = layer.acquire(np.array([5, 3]), np.array([1, 1]))
    with open_gguf(moe_path) as file:
        for name, buffer in (("gate", layer.gate), ("down", layer.down)):
            raw = file.raw(file.tensor(f"blk.0.ffn_{name}_exps.weight")).reshape(N_EXPERT, 256, -1)
            for expert, slot in zip((5, 3), slots):
                np.testing.assert_array_equal(buffer[slot * 256 : (slot + 1) * 256], raw[expert])
    with pytest.raises(ValueError, match="3 experts asked of a layer holding 2"):
        layer.acquire(np.array([0, 1, 2]), np.array([1, 1, 1]))


def test_a_file_that_changes_under_the_stream_is_an_error_that_says_so(moe_path, tmp_path):
    copy = tmp_path / "moe.gguf"
    shutil.copyfile(moe_path, copy)
    model = load_model(copy, experts=StreamOptions(cache_bytes=N_LAYERS * EXPERT_BYTES))  # one slot a layer
    cache = model.new_cache(64)
    model.forward_all(TOKENS[:8], cache)
    st = os.stat(copy)
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(ExpertStoreError, match="changed under the running model"):
        model.forward_all(TOKENS[8:16], cache)


def test_a_truncated_file_is_an_error_not_a_short_read(moe_path, tmp_path):
    copy = tmp_path / "moe.gguf"
    shutil.copyfile(moe_path, copy)
    store, layer = _layer(copy, 1)
    os.truncate(copy, layer.stacks[2].offset + layer.stacks[2].nbytes * 4)  # experts 4 on gone from the down stack
    with pytest.raises(ExpertStoreError, match="expert 6 of layer 0"):
        layer.acquire(np.array([6]), np.array([1]))


def test_options_are_checked():
    with pytest.raises(ValueError, match="must not be negative"):
        StreamOptions(cache_bytes=-1)
    with pytest.raises(ValueError, match="unknown expert cache policy 'lfu'"):
        StreamOptions(cache_bytes=1, policy="lfu")


def test_a_runs_trace_replays_to_the_hit_rate_it_had_live_and_belady_bounds_every_policy(moe_path, tmp_path):
    for policy in ("heat", "lru"):
        model = load_model(moe_path, experts=StreamOptions(cache_bytes=3 * N_LAYERS * EXPERT_BYTES, policy=policy,
                                                           trace=True))
        _run(model)
        store = model.expert_store
        store.trace.save(tmp_path / "run.trace")
        trace = Trace.load(tmp_path / "run.trace")
        assert replay(trace, policy) == (store.stats.hits, store.stats.misses)
    rates = sweep(trace, [1, 2, 4, N_EXPERT])
    for c in range(4):
        assert rates["belady"][c] == max(r[c] for r in rates.values())
    assert rates["lru"] == sorted(rates["lru"]) and rates["belady"] == sorted(rates["belady"])
    assert rates["belady"][-1] == rates["lru"][-1]  # every expert resident: only first reads miss
    with pytest.raises(ExpertStoreError, match="not an experts trace"):
        Trace.load(moe_path)


def test_pins_learned_elsewhere_replay_as_given_and_the_right_ones_match_the_oracle():
    calls = [(0, np.array([e, 3]), np.array([1, 5])) for e in (0, 1, 2, 0, 1, 2)]
    trace = Trace(layers={0: (4, 2)}, calls=calls)  # expert 3 in every call: the one worth pinning
    for policy in ("pinned+lru", "pinned+heat"):
        oracle = replay(trace, policy)
        assert replay(trace, policy, usage={0: np.array([0, 0, 0, 9])}) == oracle
        assert replay(trace, policy, usage={0: np.array([9, 1, 0, 0])})[0] < oracle[0]  # expert 0 pinned
    assert replay(trace, "pinned+heat", usage={0: np.array([3, 3, 3, 3])}) == replay(trace, "heat")  # flat: no pins


def test_a_pinned_runs_trace_replays_to_its_live_hit_rate_with_the_usage_it_was_pinned_by(moe_path, tmp_path):
    copy = tmp_path / "moe.gguf"
    shutil.copyfile(moe_path, copy)
    budget = 4 * N_LAYERS * EXPERT_BYTES
    _write_usage(copy, {0: [0, 50, 0, 0, 0, 0, 90, 0], 1: [5, 0, 0, 70, 0, 0, 0, 40]})
    pinned = load_model(copy, experts=StreamOptions(cache_bytes=budget, pin_share=0.5, trace=True))
    _run(pinned)
    store = pinned.expert_store
    assert store.stats.pinned == 4
    assert replay(store.trace, "pinned+heat", usage=load_usage(str(copy) + USAGE_SUFFIX)) == (store.stats.hits,
                                                                                               store.stats.misses)
