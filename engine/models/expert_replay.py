"""Replaying an experts trace (engine.models.expert_store.Trace) through cache policies and capacities, offline:
would more cache help, or a better policy? A persisted usage histogram cannot say: every policy needs the order.

Policies: "lru" and "heat" run the live cache's own SlotCache (so the trace of a run replays to the hit rate it
had live); "slru" (segmented LRU: a new expert on probation, a second use moves it to the protected segment, four
fifths of the slots); "pinned+lru" (the layer's most routed experts pinned in half the slots, each read at its
first use and kept, the rest LRU; the pins chosen from the whole trace, an oracle, or given); "belady" (evict the
expert used again furthest ahead: the best any cache of that size can do, the bound).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Mapping

from engine.models.expert_store import SlotCache, Trace

POLICIES = ("lru", "heat", "slru", "pinned+lru", "belady")
PROTECTED_SHARE = 0.8  # slru's protected segment
PINNED_SHARE = 0.5     # pinned+lru's pinned slots


def replay(trace: Trace, policy: str, slots: int | None = None, heat_decay: float = 0.9,
           pins: Mapping[int, Iterable[int]] | None = None) -> tuple[int, int]:
    """(hits, misses) of `policy` over the trace, each layer holding `slots` experts (None: the capacity each
    had live); pins: layer -> the experts pinned-lru pins (default: each layer's most routed in the trace)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (one of {', '.join(POLICIES)})")
    hits = misses = 0
    for layer, (n_expert, capacity) in trace.layers.items():
        calls = [(experts, pairs) for lay, experts, pairs in trace.calls if lay == layer]
        c = max(1, min(n_expert, capacity if slots is None else slots))
        if policy in ("lru", "heat"):
            h, m = _slot_cache(calls, n_expert, c, policy, heat_decay)
        elif policy == "belady":
            h, m = _belady(calls, c)
        elif policy == "slru":
            h, m = _slru(calls, c)
        else:
            pinned = list(pins[layer]) if pins is not None and layer in pins else _most_routed(calls)
            h, m = _pinned_lru(calls, c, pinned)
        hits, misses = hits + h, misses + m
    return hits, misses


def hit_rate(hits: int, misses: int) -> float:
    return hits / (hits + misses) if hits + misses else 0.0


def _slot_cache(calls, n_expert, capacity, policy, heat_decay):
    cache = SlotCache(n_expert, capacity, policy, heat_decay)
    hits = misses = 0
    for experts, pairs in calls:
        for g0 in range(0, len(experts), capacity):  # a call wanting more than the slots goes in groups, as live
            _, loads = cache.acquire(experts[g0 : g0 + capacity], pairs[g0 : g0 + capacity])
            misses += len(loads)
            hits += len(experts[g0 : g0 + capacity]) - len(loads)
    return hits, misses


def _belady(calls, capacity):
    """Each miss with the cache full evicts the resident expert next used furthest ahead (one at a time: the
    optimum of any cache of that many experts)."""
    sequence = [(i, int(e)) for i, (experts, _) in enumerate(calls) for e in experts]
    next_use = {}
    ahead = [0] * len(sequence)
    for k in range(len(sequence) - 1, -1, -1):  # the call that next uses each expert after position k
        _, e = sequence[k]
        ahead[k] = next_use.get(e, len(calls))
        next_use[e] = sequence[k][0]
    resident: dict[int, int] = {}  # expert -> its next use
    hits = misses = 0
    for k, (_, e) in enumerate(sequence):
        if e in resident:
            hits += 1
        else:
            misses += 1
            if len(resident) >= capacity:
                del resident[max(resident, key=lambda x: resident[x])]
        resident[e] = ahead[k]
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


def _most_routed(calls) -> list[int]:
    counts: dict[int, int] = {}
    for experts, pairs in calls:
        for e, n in zip(experts, pairs):
            counts[int(e)] = counts.get(int(e), 0) + int(n)
    return sorted(counts, key=lambda e: (-counts[e], e))


def _pinned_lru(calls, capacity, ranked):
    pinned = set(ranked[: int(capacity * PINNED_SHARE)])
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


def sweep(trace: Trace, capacities: Iterable[int], policies: Iterable[str] = POLICIES) -> dict[str, list[float]]:
    """policy -> the hit rate at each capacity."""
    capacities = list(capacities)
    return {p: [hit_rate(*replay(trace, p, c)) for c in capacities] for p in policies}

