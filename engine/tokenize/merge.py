"""Word -> token ids for BPE (lowest merge rank first) and SentencePiece (highest score first), compiled
with Numba.

The merge loop follows llama.cpp's symbol list and priority queue: the adjacent pair with the best
priority merges first, ties go to the leftmost pair, pairs formed by a merge join the competition.
Each final symbol becomes its token, or - when it is not one - the tokens of its UTF-8 bytes
(SentencePiece's <0xXX> fallback; BPE's one-byte tokens), skipping bytes that have none.

Strings are never built during a merge: keys live in open-addressing hash tables looked up by
code-point spans of the word. SentencePiece asks its vocabulary whether the merged text is a token
(and for its score); BPE asks its merge rules for the merged text plus where the left part ends.
"""

from __future__ import annotations

import heapq

import numba as nb
import numpy as np

import kernels.common  # noqa: F401 (the kernel cache, its CPU target and locator, set before these compile)

_FNV_OFFSET = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)
_SHORT = 64  # symbols; longer words take the heap


def code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


class SpanTable:
    """Keys (a text, and for BPE merge rules the length of its left part) found from a span of code
    points; a lookup yields the index of the first key that is equal."""

    def __init__(self, texts: list[str], splits=None):
        self.cps = code_points("".join(texts))
        self.offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)), out=self.offsets[1:])
        self.by_text = splits is None
        self.splits = np.zeros(len(texts), dtype=np.int64) if splits is None else np.asarray(splits, np.int64)
        self.slots = _build_slots(self.cps, self.offsets, self.splits)

    def args(self) -> tuple:
        return self.cps, self.offsets, self.splits, self.slots


def encode_words(words: list[str], merges: SpanTable, priorities: np.ndarray, vocab: SpanTable,
                 byte_ids: np.ndarray) -> list[tuple[int, ...]]:
    """Token ids of each word, all merged in one compiled call. `priorities[k]` belongs to merge key
    k (lower merges first); vocabulary key k is token k; `byte_ids[b]` is the token for byte b or -1."""
    bounds = np.zeros(len(words) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, words), dtype=np.int64, count=len(words)), out=bounds[1:])
    ids, ends = _encode_all(code_points("".join(words)), bounds, *merges.args(), priorities, merges.by_text,
                            *vocab.args(), byte_ids)
    ids, ends = ids.tolist(), ends.tolist()
    return [tuple(ids[a:b]) for a, b in zip([0] + ends, ends)]


@nb.njit(cache=True)
def _hash(cps, start, end, split):
    h = _FNV_OFFSET
    for i in range(start, end):
        h = (h ^ np.uint64(cps[i])) * _FNV_PRIME
    return (h ^ np.uint64(split)) * _FNV_PRIME


@nb.njit(cache=True)
def _same_key(keys, offsets, splits, k, cps, start, end, split):
    a, b = offsets[k], offsets[k + 1]
    if b - a != end - start or splits[k] != split:
        return False
    for i in range(end - start):
        if keys[a + i] != cps[start + i]:
            return False
    return True


@nb.njit(cache=True)
def _build_slots(keys, offsets, splits):
    """slots[2i] holds a key's hash and slots[2i + 1] its index + 1 (0: empty), so a probe that misses
    rarely touches the keys themselves."""
    n = len(offsets) - 1
    size = 16
    while size < 2 * n:
        size *= 2
    slots = np.zeros(2 * size, dtype=np.uint64)
    mask = np.uint64(size - 1)
    for k in range(n):
        a, b = offsets[k], offsets[k + 1]
        h = _hash(keys, a, b, splits[k])
        i = h & mask
        while slots[2 * i + 1] != 0:
            if slots[2 * i] == h and _same_key(keys, offsets, splits, np.int64(slots[2 * i + 1]) - 1,
                                               keys, a, b, splits[k]):
                break  # a repeated key keeps its first index
            i = (i + np.uint64(1)) & mask
        if slots[2 * i + 1] == 0:
            slots[2 * i] = h
            slots[2 * i + 1] = np.uint64(k + 1)
    return slots


@nb.njit(cache=True)
def _find(cps, start, end, split, keys, offsets, splits, slots):
    """The index of the key equal to (cps[start:end], split), or -1."""
    mask = np.uint64(len(slots) // 2 - 1)
    h = _hash(cps, start, end, split)
    i = h & mask
    while slots[2 * i + 1] != 0:
        k = np.int64(slots[2 * i + 1]) - 1
        if slots[2 * i] == h and _same_key(keys, offsets, splits, k, cps, start, end, split):
            return k
        i = (i + np.uint64(1)) & mask
    return -1


@nb.njit(cache=True)
def _priority(cps, start, mid, end, keys, offsets, splits, slots, priorities, by_text):
    """Priority of merging cps[start:mid] with cps[mid:end]; inf when they do not merge."""
    k = _find(cps, start, end, 0 if by_text else mid - start, keys, offsets, splits, slots)
    return np.inf if k < 0 else priorities[k]


@nb.njit(cache=True)
def _encode_all(cps, bounds, keys, offsets, splits, slots, priorities, by_text,
                vkeys, voffsets, vsplits, vslots, byte_ids):
    """Ids of every word cps[bounds[w]:bounds[w + 1]], flattened, and where each word's ids end."""
    ids = np.empty(4 * len(cps), dtype=np.int64)  # a code point is at most four byte tokens
    ends = np.empty(len(bounds) - 1, dtype=np.int64)
    n_ids = 0
    utf8 = np.empty(4, dtype=np.int64)
    for w in range(len(bounds) - 1):
        word = cps[bounds[w]:bounds[w + 1]]
        if len(word) <= _SHORT:
            lengths = _merge_short(word, keys, offsets, splits, slots, priorities, by_text)
        else:
            lengths = _merge_long(word, keys, offsets, splits, slots, priorities, by_text)
        start = 0
        for length in lengths:
            token = _find(word, start, start + length, 0, vkeys, voffsets, vsplits, vslots)
            if token >= 0:
                ids[n_ids] = token
                n_ids += 1
            else:
                for i in range(start, start + length):
                    for b in utf8[:_utf8(word[i], utf8)]:
                        if byte_ids[b] >= 0:
                            ids[n_ids] = byte_ids[b]
                            n_ids += 1
            start += length
        ends[w] = n_ids
    return ids[:n_ids], ends


@nb.njit(cache=True)
def _utf8(cp, out):
    """Write the UTF-8 bytes of code point `cp` to `out`; return how many."""
    if cp < 0x80:
        out[0] = cp
        return 1
    if cp < 0x800:
        out[0], out[1] = 0xC0 | (cp >> 6), 0x80 | (cp & 0x3F)
        return 2
    if cp < 0x10000:
        out[0], out[1], out[2] = 0xE0 | (cp >> 12), 0x80 | ((cp >> 6) & 0x3F), 0x80 | (cp & 0x3F)
        return 3
    out[0], out[1] = 0xF0 | (cp >> 18), 0x80 | ((cp >> 12) & 0x3F)
    out[2], out[3] = 0x80 | ((cp >> 6) & 0x3F), 0x80 | (cp & 0x3F)
    return 4


@nb.njit(cache=True)
def _merge_short(cps, keys, offsets, splits, slots, priorities, by_text):
    """Symbol lengths after merging, rescanning the pairs for the best after each merge: O(n^2), and
    fastest for short words."""
    n = len(cps)
    start = np.arange(n)
    length = np.ones(n, dtype=np.int64)
    ranked = np.empty(max(n - 1, 0))  # ranked[i]: priority of merging symbols i and i + 1
    for i in range(n - 1):
        ranked[i] = _priority(cps, i, i + 1, i + 2, keys, offsets, splits, slots, priorities, by_text)
    while n > 1:
        i = np.argmin(ranked[:n - 1])  # the first of the best: the leftmost
        if ranked[i] == np.inf:
            break
        length[i] += length[i + 1]
        for j in range(i + 1, n - 1):  # drop symbol i + 1 and pair i (plain loops: no temporaries)
            start[j] = start[j + 1]
            length[j] = length[j + 1]
            ranked[j - 1] = ranked[j]
        n -= 1
        for j in (i - 1, i):
            if 0 <= j < n - 1:
                ranked[j] = _priority(cps, start[j], start[j + 1], start[j + 1] + length[j + 1],
                                      keys, offsets, splits, slots, priorities, by_text)
    return length[:n]


@nb.njit(cache=True)
def _merge_long(cps, keys, offsets, splits, slots, priorities, by_text):
    """Symbol lengths after merging, with llama.cpp's priority queue: O(n log n) for long words."""
    n = len(cps)
    length = np.ones(n, dtype=np.int64)  # symbol i starts at position i; 0 once merged into its left
    nxt = np.arange(1, n + 1)
    nxt[n - 1] = -1
    prv = np.arange(-1, n - 1)
    heap = [(0.0, 0, 0, 0)]  # (priority, left, right, merged length): ties go to the leftmost pair
    heap.pop()
    for left in range(n - 1):
        p = _priority(cps, left, left + 1, left + 2, keys, offsets, splits, slots, priorities, by_text)
        if p < np.inf:
            heap.append((p, left, left + 1, 2))
    heapq.heapify(heap)
    while heap:
        _, left, right, size = heapq.heappop(heap)
        if length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
            continue  # stale: one side merged with something else since this pair was queued
        length[left], length[right] = size, 0
        nxt[left] = nxt[right]
        if nxt[left] >= 0:
            prv[nxt[left]] = left
        for a, b in ((prv[left], left), (left, nxt[left])):
            if a >= 0 and b >= 0:
                end = b + length[b]
                p = _priority(cps, a, b, end, keys, offsets, splits, slots, priorities, by_text)
                if p < np.inf:
                    heapq.heappush(heap, (p, a, b, end - a))
    return length[length > 0]
