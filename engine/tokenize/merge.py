"""The pair-merging loop shared by BPE (lowest merge rank first) and SentencePiece (highest score first).

Semantics are llama.cpp's symbol list and priority queue: the adjacent pair with the best priority
merges first, ties go to the leftmost pair, and pairs formed by a merge join the competition. Short
words (nearly all) take a list of pair priorities scanned in C for the best; long ones (a 100 kB run of one
character is a single word) take a heap that keeps them O(n log n). Both merge the same pairs.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from itertools import repeat
from operator import add

_NEVER = float("inf")
_RESCAN_LIMIT = 48  # symbols; beyond this the heap is faster


def merge(symbols: list[str], priorities: dict, *, by_text: bool) -> list[str]:
    """Merge adjacent symbols while some pair has a priority (lower merges first).

    `priorities` is keyed by the merged text when `by_text` (SentencePiece: a pair merges when the
    result is a token), else by the (left, right) pair (BPE: a pair merges when a merge rule names it).
    """
    if len(symbols) > _RESCAN_LIMIT:
        return _merge_heap(symbols, priorities, by_text)
    get = priorities.get

    def rank(left: str, right: str) -> float:
        return get(left + right if by_text else (left, right), _NEVER)

    keys = map(add, symbols, symbols[1:]) if by_text else zip(symbols, symbols[1:])
    ranked = list(map(get, keys, repeat(_NEVER)))  # ranked[i]: the pair (symbols[i], symbols[i + 1])
    while ranked:
        best = min(ranked)
        if best == _NEVER:
            break
        i = ranked.index(best)  # the leftmost of the best
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
        del ranked[i]
        if i > 0:
            ranked[i - 1] = rank(symbols[i - 1], symbols[i])
        if i < len(ranked):
            ranked[i] = rank(symbols[i], symbols[i + 1])
    return symbols


def _merge_heap(symbols: list[str], priorities: dict, by_text: bool) -> list[str]:
    n = len(symbols)
    text = list(symbols)  # text[i] is "" once symbol i has been merged into its left neighbour
    nxt = list(range(1, n)) + [-1]
    prv = list(range(-1, n - 1))

    def entry(left: int, right: int):
        merged = text[left] + text[right]
        key = priorities.get(merged if by_text else (text[left], text[right]))
        return None if key is None else (key, left, right, merged)

    heap = [e for e in map(entry, range(n - 1), range(1, n)) if e]
    heapify(heap)
    while heap:
        _, left, right, merged = heappop(heap)
        if not text[left] or not text[right] or text[left] + text[right] != merged:
            continue  # stale: one side merged with something else since this pair was queued
        text[left], text[right] = merged, ""
        nxt[left] = nxt[right]
        if nxt[left] >= 0:
            prv[nxt[left]] = left
        for pair in ((prv[left], left), (left, nxt[left])):
            if pair[0] >= 0 and pair[1] >= 0 and (e := entry(*pair)):
                heappush(heap, e)
    return [t for t in text if t]
