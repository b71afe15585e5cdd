"""Speed measurements: prefill and decode throughput, time to first token, load time, peak RSS.

Two peers, each run on the same GGUF and thread count, alternating runs with ours so both see the
same machine state, and each side warming up before each of its timed runs (llama-bench's default):
- `llama-bench` (the default): llama.cpp's own benchmark, a native build run as a separate process,
  one repetition per turn (`-p N -n 0` for prefill, `-p 0 -n M -d N` for decode after an N-token
  prompt: the same workload as ours);
- `binding`: llama.cpp through llama-cpp-python (the optional `peer` extra) in this process, on our
  token ids. Its Python loop per token understates llama.cpp's decode.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from engine.benchmarks.bandwidth import read_bandwidth_gbs, weight_bytes_per_token
from engine.errors import FucinaError
from engine.models import load_model
from engine.models.expert_store import StreamOptions
from engine.models.footprint import Footprint
from engine.models.model import Model


@dataclass
class Run:
    prefill_tps: float
    decode_tps: float
    ttft_s: float  # prompt fed to first token chosen
    decode_read_bytes: float = 0.0  # read from disk per decoded token (streamed experts)


def prompt_ids(vocab_size: int, n: int, seed: int = 0) -> list[int]:
    """A fixed pseudo-random prompt from the ordinary part of the vocabulary."""
    rng = np.random.default_rng(seed)
    return rng.integers(100, min(vocab_size, 30000), size=n).tolist()


def _timed_generation(prefill: Callable[[list[int]], np.ndarray], step: Callable[[int], np.ndarray],
                      prompt: list[int], gen_tokens: int, bytes_read: Callable[[], int] = lambda: 0) -> Run:
    t0 = time.perf_counter()
    tok = int(np.argmax(prefill(prompt)))
    t1 = time.perf_counter()
    read_before = bytes_read()
    for _ in range(gen_tokens - 1):
        tok = int(np.argmax(step(tok)))
    t2 = time.perf_counter()
    return Run(len(prompt) / (t1 - t0), (gen_tokens - 1) / (t2 - t1), t1 - t0,
               (bytes_read() - read_before) / max(1, gen_tokens - 1))


def run_fucina(model: Model, prompt: list[int], gen_tokens: int, warm_up: bool = False) -> Run:
    """One timed prefill of `prompt` and decode of `gen_tokens`; with `warm_up`, after an untimed prefill of
    the same prompt and a decode step, as llama-bench warms up before each of its runs (the peer's run in
    between leaves our threads and caches cold, and the first run would otherwise count the decode kernels'
    compilation)."""
    cache = model.new_cache(len(prompt) + gen_tokens)
    if warm_up:
        model.forward(prompt, cache)
        model.forward(prompt[:1], cache)
        cache.truncate(0)
    store = getattr(model, "expert_store", None)
    return _timed_generation(lambda ids: model.forward(ids, cache), lambda t: model.forward([t], cache),
                             prompt, gen_tokens, lambda: store.stats.bytes_read if store is not None else 0)


class LlamaCppPeer:
    """llama.cpp on the same GGUF: greedy argmax over its logits, like ours."""

    def __init__(self, path: str, threads: int, n_ctx: int):
        try:
            import llama_cpp
        except ImportError:
            raise FucinaError("the llama.cpp peer needs the `peer` extra: pip install -e '.[peer]'") from None
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_ubatch=512,
                                   n_threads=threads, n_threads_batch=threads, verbose=False)
        self.n_vocab = self.llm.n_vocab()

    def _logits(self) -> np.ndarray:
        return np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.n_vocab,))

    def run(self, prompt: list[int], gen_tokens: int) -> Run:
        self.llm.reset()

        def feed(ids):
            self.llm.eval(ids)
            return self._logits()

        return _timed_generation(feed, lambda t: feed([t]), prompt, gen_tokens)


class LlamaBenchPeer:
    """llama.cpp's `llama-bench` (found as $FUCINA_LLAMA_BENCH or on PATH), one repetition per run, with the
    arguments in $FUCINA_LLAMA_BENCH_ARGS added (say `--repack 0` where its repacked weights crash a model)."""

    def __init__(self, path: str, threads: int, executable: str | None = None):
        self.exe = executable or os.environ.get("FUCINA_LLAMA_BENCH") or shutil.which("llama-bench")
        if not self.exe or not os.path.exists(self.exe):
            raise FucinaError("the llama-bench peer needs llama.cpp's llama-bench: build it (BENCHMARKS.md) and "
                              "put it on PATH or set FUCINA_LLAMA_BENCH")
        self.path, self.threads = path, threads
        self.extra = shlex.split(os.environ.get("FUCINA_LLAMA_BENCH_ARGS", ""))

    def _tps(self, *args: str) -> float:
        cmd = [self.exe, "-m", self.path, "-t", str(self.threads), "-r", "1", "-o", "json", *self.extra, *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            raise FucinaError(f"llama-bench failed ({out.returncode}): {out.stderr.strip()[-500:]}")
        return float(json.loads(out.stdout)[0]["avg_ts"])

    def run(self, prompt: list[int], gen_tokens: int) -> Run:
        prefill = self._tps("-p", str(len(prompt)), "-n", "0")
        decode = self._tps("-p", "0", "-n", str(gen_tokens), "-d", str(len(prompt)))
        return Run(prefill, decode, len(prompt) / prefill)


def peak_rss_mb() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 1024 / 1024


def summary(values: Sequence[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


PEERS = ("llama-bench", "binding")


def benchmark(path: str, threads: int, prompt_tokens: int, gen_tokens: int, runs: int, peer: str | None,
              log: Callable[[str], None] = lambda s: None,
              experts: StreamOptions | Callable[[Footprint], StreamOptions | None] | None = None,
              trace_to: str | None = None) -> dict:
    """Our prefill and decode speeds (and the peer's, alternating) on the GGUF at `path`; experts: as
    load_model's, streamed from disk into a cache of that budget (the result then has their hit rate and the
    bytes read; trace_to: where their trace is saved, when the options record one)."""
    t0 = time.perf_counter()
    model = load_model(path, experts=experts)
    load_s = time.perf_counter() - t0
    prompt = prompt_ids(model.vocab_size, prompt_tokens)
    # first token after load, on a short prompt: what a user waits for after opening a model
    first = run_fucina(model, prompt[:16], 1)
    result = {"model": str(path), "threads": threads, "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens,
              "runs": runs, "load_s": load_s, "load_to_first_token_s": load_s + first.ttft_s, "peer": peer}
    ours: list[Run] = []
    theirs: list[Run] = []
    llama = None
    for i in range(runs):
        ours.append(run_fucina(model, prompt, gen_tokens, warm_up=True))
        log(f"run {i + 1}/{runs} fucina: prefill {ours[-1].prefill_tps:.1f} tok/s, decode {ours[-1].decode_tps:.1f} tok/s")
        if i == 0:
            result["peak_rss_mb"] = peak_rss_mb()  # before the peer adds its own memory
        if peer:
            if llama is None:
                llama = (LlamaBenchPeer(path, threads) if peer == "llama-bench"
                         else LlamaCppPeer(path, threads, prompt_tokens + gen_tokens + 8))
            theirs.append(llama.run(prompt, gen_tokens))
            log(f"run {i + 1}/{runs} llama.cpp: prefill {theirs[-1].prefill_tps:.1f} tok/s, "
                f"decode {theirs[-1].decode_tps:.1f} tok/s")
    store = getattr(model, "expert_store", None)
    if store is not None:  # over every run's prefill and decode, warm-ups included
        result["experts_hit_rate"] = store.stats.hit_rate
        result["experts_bytes_read"] = store.stats.bytes_read
        result["experts_policy"], result["experts_cache_bytes"] = store.options.policy, store.options.cache_bytes
        result["experts_pinned"] = store.stats.pinned
        result["experts_prefetched"] = store.stats.prefetched
        result["experts_prefetch_used"] = store.stats.prefetch_used
        result["experts_decode_read_bytes"] = summary([r.decode_read_bytes for r in ours])
        try:  # what pins a later run's experts, as after any streamed command
            store.save_usage()
        except OSError as e:
            log(f"warning: the experts' usage was not saved beside the model: {e.strerror}")
        if trace_to and store.trace is not None:
            store.trace.save(trace_to)
    for key in ("prefill_tps", "decode_tps", "ttft_s"):
        result[key] = summary([getattr(r, key) for r in ours])
        if peer:
            result["llama_cpp_" + key] = summary([getattr(r, key) for r in theirs])
            ratios = [getattr(a, key) / getattr(b, key) for a, b in zip(ours, theirs)]
            result["ratio_" + key] = summary(ratios)
    result["weight_bytes_per_token"] = weight_bytes_per_token(path)
    result["read_bandwidth_gbs"] = read_bandwidth_gbs(threads)
    for side in ("", "llama_cpp_") if peer else ("",):
        result[side + "decode_gbs"] = result[side + "decode_tps"]["median"] * result["weight_bytes_per_token"] / 1e9
    return result


def rows_throughput(path: str, row_counts: Sequence[int], context: int, runs: int,
                    log: Callable[[str], None] = lambda s: None) -> dict:
    """Tokens per second of one row-wise call over m rows after a `context`-token prompt (what a
    speculative verify of m tokens costs), for each m; medians of `runs` calls."""
    model = load_model(path)
    prompt = prompt_ids(model.vocab_size, context)
    result = {"model": str(path), "context": context, "runs": runs, "rows": {}}
    cache = model.new_cache(context + max(row_counts))
    model.rows_ready(cache, wait=True)
    model.forward(prompt, cache)
    cache.mark()  # each run goes back here (a recurrent state can only go back to a mark)
    for m in row_counts:
        rows = prompt_ids(model.vocab_size, m, seed=m)
        times = []
        for _ in range(runs):
            cache.truncate(context)
            t0 = time.perf_counter()
            model.forward_rows(rows, cache)
            times.append(time.perf_counter() - t0)
        result["rows"][m] = {"tokens_per_s": summary([m / t for t in times]), "call_s": summary(times)}
        log(f"{m} rows: {m / statistics.median(times):.1f} tok/s ({statistics.median(times) * 1e3:.1f} ms a call)")
    return result
