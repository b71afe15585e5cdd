"""Replaying an experts trace (engine.models.expert_store.Trace) through cache policies and capacities, offline:
would more cache help, or a better policy? A persisted usage histogram cannot say: every policy needs the order.

Policies: "lru" and "heat" run the live cache's own SlotCache, a call's groups formed as live (so a run's trace
replays to the hit rate it had live, and to what another of them has live on the same routing); "pinned+heat"
(the live cache with pins: each layer's most routed experts in half its slots, none where its usage is too flat);
"slru" (segmented LRU: a new expert on probation, a second use moves it to the protected segment, four fifths of
the slots); "pinned+lru" (the most routed pinned in half the slots, each read at its first use and kept, the rest
LRU); "belady" (evict the expert used again furthest ahead: the best any cache of that size can do, the bound).
The pinned policies pin by the trace's own usage (an oracle) or by a given one: an earlier run's, as it is left
beside the model, which measures how learned pins carry over to another run.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Mapping

import numpy as np

from engine.models.expert_store import PIN_SHARE, SlotCache, StreamOptions, Trace, choose_pins

POLICIES = ("lru", "heat", "pinned+heat", "slru", "pinned+lru", "belady")
PROTECTED_SHARE = 0.8  # slru's protected segment


def replay(trace: Trace, policy: str, slots: int | None = None, heat_decay: float = 0.9,
           usage: Mapping[int, np.ndarray] | None = None) -> tuple[int, int]:
    """(hits, misses) of `policy` over the trace, each layer holding `slots` experts (None: the capacity each
    had live); usage: layer -> rows routed to each expert, what the pinned policies pin by (default: the trace's
    own, an oracle; else an earlier run's, as engine.models.expert_store.load_usage reads it)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (one of {', '.join(POLICIES)})")
    hits = misses = 0
    for layer, (n_expert, capacity) in trace.layers.items():
        calls = [(experts, pairs) for lay, experts, pairs in trace.calls if lay == layer]
        c = max(1, min(n_expert, capacity if slots is None else slots))
        if policy in ("lru", "heat"):
            h, m = _slot_cache(calls, n_expert, c, policy, heat_decay)
        elif policy == "pinned+heat":  # the live cache with pins, declined where the usage is flat
            pins = choose_pins(_usage(usage, layer, calls, n_expert), c, PIN_SHARE, StreamOptions.pin_min_advantage)
            h, m = _slot_cache(calls, n_expert, c, "heat", heat_decay, np.zeros(0, np.int64) if pins is None else pins)
        elif policy == "belady":
            h, m = _belady(calls, c)
        elif policy == "slru":
            h, m = _slru(calls, c)
        else:
            counts = _usage(usage, layer, calls, n_expert)
            top = np.argsort(-counts, kind="stable")[: int(c * PIN_SHARE)]
            h, m = _pinned_lru(calls, c, top[counts[top] > 0])
        hits, misses = hits + h, misses + m
    return hits, misses


def hit_rate(hits: int, misses: int) -> float:
    return hits / (hits + misses) if hits + misses else 0.0


def _slot_cache(calls, n_expert, capacity, policy, heat_decay, pins=np.zeros(0, np.int64)):
    cache = SlotCache(n_expert, capacity, policy, heat_decay, pins)
    hits = misses = 0
    for experts, pairs in calls:
        for group in cache.call_groups(experts):  # a call wanting more than the slots goes in groups, as live
            _, loads = cache.acquire(experts[group], pairs[group])
            misses += len(loads)
            hits += len(group) - len(loads)
    return hits, misses


def _belady(calls, capacity):
    """Each miss with the cache full evicts the resident expert next used furthest ahead, a call's resident
    experts used before its misses are read (as live calls go): the optimum of any cache of that many experts."""
    next_call = {}
    ahead = [None] * len(calls)  # per call: expert -> the next call using it
    for i in range(len(calls) - 1, -1, -1):
        experts = [int(e) for e in calls[i][0]]
        ahead[i] = {e: next_call.get(e, len(calls)) for e in experts}
        next_call.update((e, i) for e in experts)
    resident: dict[int, int] = {}  # expert -> its next use
    hits = misses = 0
    for i in range(len(calls)):
        missing = [e for e in ahead[i] if e not in resident]
        hits += len(ahead[i]) - len(missing)
        resident.update((e, n) for e, n in ahead[i].items() if e in resident)
        for e in missing:
            misses += 1
            if len(resident) >= capacity:
                del resident[max(resident, key=lambda x: resident[x])]
            resident[e] = ahead[i][e]
    return hits, misses


def _slru(calls, capacity):
    protected_cap = max(1, int(capacity * PROTECTED_SHARE)) if capacity > 1 else 0
    probation: OrderedDict[int, None] = OrderedDict()
    protected: OrderedDict[int, None] = OrderedDict()
    hits = misses = 0
    for experts, _ in calls:
        for e in (int(x) for x in experts):
            if e in protected:
                hits += 1
                protected.move_to_end(e)
            elif e in probation:
                hits += 1
                del probation[e]
                protected[e] = None
                if len(protected) > protected_cap:
                    demoted, _ = protected.popitem(last=False)
                    probation[demoted] = None
            else:
                misses += 1
                probation[e] = None
            while len(probation) + len(protected) > capacity:
                (probation if probation else protected).popitem(last=False)
    return hits, misses


def _usage(usage, layer: int, calls, n_expert: int) -> np.ndarray:
    """The rows routed to each of the layer's experts that pins are chosen by: the given usage's (none pinned
    where it has none for the layer), else the trace's own."""
    if usage is not None:
        counts = usage.get(layer)
        return counts if counts is not None and counts.shape == (n_expert,) else np.zeros(n_expert, np.int64)
    counts = np.zeros(n_expert, np.int64)
    for experts, pairs in calls:
        np.add.at(counts, experts, pairs)
    return counts


def _pinned_lru(calls, capacity, pins):
    pinned = {int(e) for e in pins}
    lru_cap = capacity - len(pinned)
    lru: OrderedDict[int, None] = OrderedDict()
    read = set()  # the pins read in so far: each is read once, at its first use
    hits = misses = 0
    for experts, _ in calls:
        for e in (int(x) for x in experts):
            if e in pinned:
                hits, misses = (hits + 1, misses) if e in read else (hits, misses + 1)
                read.add(e)
            elif e in lru:
                hits += 1
                lru.move_to_end(e)
            else:
                misses += 1
                if lru_cap:
                    lru[e] = None
                    if len(lru) > lru_cap:
                        lru.popitem(last=False)
    return hits, misses


def sweep(trace: Trace, capacities: Iterable[int], policies: Iterable[str] = POLICIES,
          usage: Mapping[int, np.ndarray] | None = None) -> dict[str, list[float]]:
    """policy -> the hit rate at each capacity (usage: as replay's)."""
    capacities = list(capacities)
    return {p: [hit_rate(*replay(trace, p, c, usage=usage)) for c in capacities] for p in policies}
