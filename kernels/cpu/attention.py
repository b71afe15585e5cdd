"""Scaled dot-product attention over a KV cache, with causal and sliding-window masks.

Keys and values arrive as [positions, kv_heads, head_dim] arrays, either f16 bit
patterns (uint16, the default cache) or float32 (a dequantized q8_0 cache).
Query head h reads kv head h // (heads / kv_heads) (grouped-query attention).

A query at absolute position p sees key j when j <= p and, with a window w > 0,
p - j < w (llama.cpp's standard sliding window). Sinks (gpt-oss) are one logit per query head added to the
softmax's denominator, as ggml's soft_max_ext takes them.
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit, prange

from kernels.common.quant_blocks import KERNEL
from kernels.cpu.fast_exp import exp32
from kernels.cpu.float_dot import accumulate, dot


# a decode step's attention tasks: at least this many (an even count), so that 2 or 4 threads share them evenly
_MIN_TASKS = 4


@njit(parallel=True, **KERNEL)
def decode_heads(q, k, v, n_keys, window, scale, sinks, out):
    """out [heads, d] = attention of one query row q [heads, d] (C-contiguous) over cache rows
    [0, n_keys) of k, v [positions, kv_heads, d] (f16 bits or float32), heads split over threads; sinks
    [heads] (or empty): each head's logit in the softmax's denominator.

    A task takes query heads that share a kv head (a whole group where there are kv heads enough) and reads
    each key and value row once for all of them: read once per head, a 2,048-key cache's rows came from beyond
    L2 eight times over (Qwen3-30B-A3B's groups of 8; its 48 layers' attention at 2,048 keys took 80 ms a token,
    now 41 ms on 2 threads). Each head's arithmetic is its own, in key order, whichever heads share its task."""
    n_head, d = q.shape
    kv_heads = k.shape[1]
    group = n_head // kv_heads
    parts = group  # each kv head's query heads in `parts` tasks: the fewest that make an even count of 4 or more
    for p in range(1, group + 1):
        if group % p == 0 and kv_heads * p >= _MIN_TASKS and kv_heads * p % 2 == 0:
            parts = p
            break
    per = group // parts
    start = 0
    if window > 0 and n_keys > window:
        start = n_keys - window
    for task in prange(kv_heads * parts):
        kvh = task // parts
        h0 = kvh * group + (task % parts) * per
        scores = np.empty((per, n_keys - start), dtype=np.float32)
        m = np.full(per, -np.inf, dtype=np.float32)
        for j in range(start, n_keys):
            key = k[j, kvh]
            for t in range(per):
                s = dot(q[h0 + t], key) * scale
                scores[t, j - start] = s
                if s > m[t]:
                    m[t] = s
        totals = np.empty(per, dtype=np.float32)
        for t in range(per):
            if sinks.size:
                m[t] = max(m[t], sinks[h0 + t])
            for j in range(scores.shape[1]):  # apart from the sum, so the exp vectorizes
                scores[t, j] = exp32(scores[t, j] - m[t])
            total = np.float32(0.0)
            for j in range(scores.shape[1]):
                total += scores[t, j]
            if sinks.size:
                total += exp32(sinks[h0 + t] - m[t])
            totals[t] = total
        acc = np.zeros((per, d), dtype=np.float32)
        for j in range(start, n_keys):
            value = v[j, kvh]
            for t in range(per):
                accumulate(acc[t], scores[t, j - start], value)
        for t in range(per):
            inv = np.float32(1.0) / totals[t]
            for c in range(d):
                out[h0 + t, c] = acc[t, c] * inv


@njit(**KERNEL)
def decode_rows(q, k, v, n_keys, window, scale, sinks, out):
    """out [m, heads, d] = attention of the query rows q [m, heads, d] of one cache, row i over its first
    n_keys[i] rows, one row at a time."""
    for i in range(q.shape[0]):
        decode_heads(q[i], k, v, n_keys[i], window, scale, sinks, out[i])


def attention_decode(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_keys: int, window: int, scale: float,
                     out: np.ndarray | None = None, sinks: np.ndarray | None = None) -> np.ndarray:
    """One query row (q [heads, head_dim]) at position n_keys-1 against cache rows [0, n_keys)."""
    if out is None:
        out = np.empty_like(q)
    decode_heads(q, k, v, n_keys, window, np.float32(scale), _NO_SINKS if sinks is None else sinks, out)
    return out


# Causal prefill: a chunk of queries multiplies every key up to its last query, so smaller chunks skip
# more of the masked half (128: 62% of the full square at 512 tokens, 256: 75%) while the GEMMs stay large.
_QUERY_CHUNK = 128
_u = np.uint64  # unsigned subscripts: no negative-index fix-up in the way of the loop vectorizer
# The (chunk, kv head) tasks of a prefill run on this many threads at once, each with one-thread GEMMs:
# OpenBLAS's own threads would spin on after each call and take the cores the Numba kernels need next.
# Fewer (query, key) pairs than this stay on the calling thread (a task's hand-over costs about as much as
# their work): 32 queries at the start of a prompt, or the 21 of a reopened chat's new message after its 2,036
# keys (Qwen3.5 shape: 11.4 -> 6.5 ms a layer threaded).
_THREADED_MIN_PAIRS = 32 * 32
_pools: dict[int, ThreadPoolExecutor] = {}


def _workers(n: int) -> ThreadPoolExecutor:
    if n not in _pools:
        _pools[n] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="attention")
    return _pools[n]


_NO_SINKS = np.zeros(0, np.float32)


def attention_prefill(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos0: int, window: int, scale: float,
                      threads: int = 1, sinks: np.ndarray | None = None) -> np.ndarray:
    """Queries q [n, heads, d] at positions q_pos0.. against float32 keys/values [n_keys, kv_heads, d]; sinks:
    float32 [heads] logits in each head's softmax denominator, or None.

    Uses BLAS per kv head over query chunks, so the score matrix stays at most chunk x n_keys per head.
    The tasks are independent and each computes alike on any thread, so `threads` never changes bits.
    """
    n, n_head, d = q.shape
    kv_heads = k.shape[1]
    group = n_head // kv_heads
    out = np.empty((n, n_head, d), dtype=np.float32)

    def task(c0: int, kvh: int) -> None:
        c1 = min(n, c0 + _QUERY_CHUNK)
        # visible keys of this chunk: those any of its queries can see
        lo = 0 if window <= 0 else max(0, q_pos0 + c0 - window + 1)
        hi = q_pos0 + c1
        kt = k[lo:hi, kvh, :]
        vt = v[lo:hi, kvh, :]
        heads = slice(kvh * group, (kvh + 1) * group)
        # all query heads of the group in one GEMM: [(chunk*group), d] @ [d, keys]
        qg = q[c0:c1, heads, :].reshape(-1, d)
        s = (qg @ kt.T).reshape(c1 - c0, group, hi - lo)
        group_sinks = _NO_SINKS if sinks is None else sinks[heads]
        _masked_softmax(s, q_pos0 + c0, lo, window, np.float32(scale), group_sinks)
        out[c0:c1, heads, :] = (s.reshape(-1, hi - lo) @ vt).reshape(c1 - c0, group, d)

    tasks = [(c0, kvh) for c0 in range(0, n, _QUERY_CHUNK) for kvh in range(kv_heads)]
    if threads <= 1 or len(tasks) < 2 or n * (q_pos0 + n) < _THREADED_MIN_PAIRS:
        for t in tasks:
            task(*t)
    else:
        list(_workers(threads).map(lambda t: task(*t), tasks[::-1]))  # the longest chunks first
    return out


@njit(**KERNEL)
def _masked_softmax(s, q_pos0, key_pos0, window, scale, sinks):
    """In place, s [queries, heads, keys] of queries at q_pos0.. and keys at key_pos0..: the
    softmax of scale * s over each query's visible keys, 0 for the others (one pass per row
    instead of NumPy's mask, max, exp, sum and divide over the whole block); sinks [heads] (or empty): each
    head's logit in the denominator, in the max too, as ggml's. On the calling thread: the tasks of
    attention_prefill run side by side."""
    n, heads, m = s.shape
    for i in range(n):
        p = q_pos0 + i
        j_hi = min(m, p - key_pos0 + 1)
        j_lo = 0 if window <= 0 else min(j_hi, max(0, p - window + 1 - key_pos0))
        for h in range(heads):
            row = s[i, h]
            top = row[j_hi - 1]
            for j in range(j_lo, j_hi):
                top = max(top, row[_u(j)])
            if sinks.size:
                top = max(top, sinks[h] / scale)
            for j in range(j_lo, j_hi):  # apart from the sum, so the exp vectorizes
                row[_u(j)] = exp32((row[_u(j)] - top) * scale)
            total = np.float32(0.0)
            for j in range(j_lo, j_hi):
                total += row[_u(j)]
            if sinks.size:
                total += exp32(sinks[h] - top * scale)
            inv = np.float32(1.0) / total
            for j in range(j_lo, j_hi):
                row[_u(j)] *= inv
            row[:j_lo] = 0
            row[j_hi:] = 0
