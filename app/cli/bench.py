"""`fucina bench`: throughput, latency, load time and memory, optionally beside llama.cpp."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from app.cli.common import (
    add_compute_options, add_stream_options, configure_compute, resolve_model_path, stream_plan,
)
from app.cli.sampling import add_sampler_options, sampler_config
from engine.benchmarks.peer import PEERS, benchmark, rows_throughput
from engine.benchmarks.cold_start import cold_start
from engine.benchmarks.reopen import reopen_benchmark
from engine.benchmarks.speculation import load_workload, spec_benchmark
from engine.platform.catalog import catalog
from engine.errors import BenchWorkloadError, FucinaError
from engine.models import load_model

WORKLOADS = Path(__file__).resolve().parents[2] / "benchmarks" / "workloads"  # the built-in ones, by name


def _print_json(result: dict) -> int:
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


def run_bench(args) -> int:
    if args.cold_start:
        return _run_cold_start(args)
    threads = configure_compute(args)
    path = resolve_model_path(args.model)
    log = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    if args.reopen:
        return _run_reopen(args, path, threads, log)
    if args.rows:
        return _run_rows(args, path, threads, log)
    if args.spec:
        return _run_spec(args, path, threads, log)
    if args.workload is not None:
        raise BenchWorkloadError("--workload goes with --spec")
    r = benchmark(str(path), threads, args.prompt_tokens, args.gen_tokens, args.runs, args.peer, log,
                  experts=stream_plan(args), trace_to=args.moe_trace)
    if args.json:
        return _print_json(r)
    print(f"{path.name}: {threads} threads, {args.prompt_tokens}-token prompt, {args.gen_tokens} greedy tokens, "
          f"{args.runs} runs")
    print(f"load {r['load_s']:.2f} s, load to first token {r['load_to_first_token_s']:.2f} s, "
          f"peak RSS {r['peak_rss_mb']:.0f} MB")
    for key, label, unit in (("prefill_tps", "prefill", "tok/s"), ("decode_tps", "decode", "tok/s"),
                             ("ttft_s", "time to first token", "s")):
        s = r[key]
        line = f"{label:>20}: {s['median']:8.2f} {unit} (min {s['min']:.2f}, max {s['max']:.2f})"
        if args.peer:
            p, q = r["llama_cpp_" + key], r["ratio_" + key]
            line += (f" | {args.peer} {p['median']:8.2f} | ratio {q['median']:.2f}x "
                     f"(min {q['min']:.2f}, max {q['max']:.2f})")
        print(line)
    mb, bandwidth = r["weight_bytes_per_token"] / 1e6, r["read_bandwidth_gbs"]
    line = (f"{'weights read':>20}: {mb:8.1f} MB a token; decode reads {r['decode_gbs']:.1f} GB/s "
            f"({r['decode_gbs'] / bandwidth:.0%} of this machine's {bandwidth:.1f} GB/s with {threads} threads)")
    if args.peer:
        line += f" | {args.peer} {r['llama_cpp_decode_gbs']:.1f} GB/s"
    print(line)
    if "experts_hit_rate" in r:
        print(f"{'experts streamed':>20}: {r['experts_policy']} cache of {r['experts_cache_bytes'] / 1e6:.0f} MB, "
              f"hit rate {r['experts_hit_rate']:.1%}, {r['experts_bytes_read'] / 1e9:.2f} GB read over every run, "
              f"{r['experts_decode_read_bytes']['median'] / 1e6:.0f} MB per decoded token"
              + (f", {r['experts_prefetch_used']} of {r['experts_prefetched']} read ahead routed to"
                 if r["experts_prefetched"] else ""))
    return 0


def _run_cold_start(args) -> int:
    if args.model not in catalog():
        raise FucinaError(f"--cold-start measures a starter model ({', '.join(catalog())}), got {args.model!r}")
    r = cold_start(args.model, args.download_s, warmup=not args.no_warmup)
    if args.json:
        return _print_json(r)
    print(f"{args.model}: fresh kernel cache, {'warm-up from the start' if r['warmup'] else 'no warm-up'}, "
          f"download simulated as {args.download_s:g} s; kernels for {r['kernel_target']}"
          + ("" if r["warmup_stages_run"] or not r["warmup"] else ", shipped compiled (no warm-up to run)"))
    print(f"first token {r['first_token_after_download_s']:.1f} s after the download (warm-up {r['warmup_s']:.1f} s, "
          f"of which {r['wait_after_download_s']:.1f} s after the download; model load {r['load_s']:.1f} s)")
    return 0


def _run_rows(args, path, threads: int, log) -> int:
    try:
        counts = [int(m) for m in args.rows.split(",")]
    except ValueError:
        raise FucinaError(f"--rows takes comma-separated row counts, got {args.rows!r}") from None
    if not counts or min(counts) < 1:
        raise FucinaError("--rows needs row counts of at least 1")
    r = rows_throughput(str(path), counts, args.prompt_tokens, args.runs, log) | {"threads": threads}
    if args.json:
        return _print_json(r)
    print(f"{path.name}: {threads} threads, row-wise calls after a {args.prompt_tokens}-token prompt, {args.runs} runs")
    for m, s in r["rows"].items():
        t = s["tokens_per_s"]
        print(f"  {m:3d} rows: {t['median']:8.1f} tok/s (min {t['min']:.1f}, max {t['max']:.1f})")
    return 0


def _run_reopen(args, path, threads: int, log) -> int:
    r = reopen_benchmark(str(path), args.reopen, args.runs, log) | {"threads": threads}
    if args.json:
        return _print_json(r)
    w, c, x = r["warm_ttft_s"], r["cold_ttft_s"], r["speedup"]
    print(f"{path.name}: {threads} threads, a {r['conversation_tokens']}-token conversation reopened, {args.runs} runs")
    print(f"  from the sidecar: first token {w['median']:.3f} s (min {w['min']:.3f}, max {w['max']:.3f}), "
          f"{r['warm_prefilled_tokens']} tokens prefilled, {r['warm_reused_tokens']} reused")
    print(f"  re-prefilled:     first token {c['median']:.3f} s (min {c['min']:.3f}, max {c['max']:.3f}), "
          f"{r['cold_prefilled_tokens']} tokens prefilled")
    print(f"  speedup {x['median']:.1f}x (min {x['min']:.1f}, max {x['max']:.1f}); sidecar {r['sidecar_bytes']:,} "
          f"bytes, {r['sidecar_bytes_per_token']:,} per token")
    if r["state_checkpoint_bytes"]:
        print(f"  recurrent state checkpoint beside it: {r['state_checkpoint_bytes']:,} bytes")
    return 0


def workloads(name: str | None) -> list:
    """`name` as a file, else a built-in workload's name; None: every built-in workload."""
    builtin = sorted(WORKLOADS.glob("*.json"))
    if name is None:
        return [load_workload(p) for p in builtin]
    if Path(name).is_file():
        return [load_workload(name)]
    for p in builtin:
        if p.stem == name:
            return [load_workload(p)]
    raise BenchWorkloadError(f"no workload file or built-in workload {name!r}; built-in: "
                             f"{', '.join(p.stem for p in builtin)}")


def _run_spec(args, path, threads: int, log) -> int:
    if args.max_tokens is not None and args.max_tokens < 1:
        raise BenchWorkloadError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    chosen = workloads(args.workload)
    r = spec_benchmark(load_model(path), chosen, args.runs, sampler=sampler_config(args),
                       max_tokens=args.max_tokens, log=log) | {"model": str(path), "threads": threads}
    if args.json:
        return _print_json(r)
    print(f"{path.name}: {threads} threads, {args.runs} runs per workload, plain and speculative replies identical; "
          f"verify costs ready in {r['verify_costs_s']:.2f} s")
    for w in r["workloads"]:
        p, s, x, t, a = (w[k] for k in ("plain_tps", "spec_tps", "speedup", "tokens_per_step", "acceptance"))
        print(f"{w['workload']:>16}: plain {p['median']:7.2f} tok/s | speculative {s['median']:7.2f} tok/s | "
              f"speedup {x['median']:.2f}x (min {x['min']:.2f}, max {x['max']:.2f}) | "
              f"{t['median']:.2f} tokens/step | acceptance {100 * a['median']:.0f}% | {w['reply_tokens']} tokens")
        if "cascade_tps" in w:
            c, v, ct, ms = (w[k] for k in ("cascade_tps", "vs_cascade", "cascade_tokens_per_step",
                                           "layer_ms_per_token"))
            print(f"{'':>16}  n-gram cascade alone {c['median']:7.2f} tok/s, {ct['median']:.2f} tokens/step: with the "
                  f"next-token layer {v['median']:.2f}x (min {v['min']:.2f}, max {v['max']:.2f}); the layer "
                  f"{ms['median']:.1f} ms per token")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="measure prefill/decode speed, optionally against llama.cpp")
    p.add_argument("model", help="a starter model name or a path to a .gguf file")
    add_compute_options(p)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--peer", nargs="?", const="llama-bench", choices=PEERS, default=None,
                   help="also run llama.cpp, alternating runs: llama-bench (default; $FUCINA_LLAMA_BENCH or on PATH) "
                        "or binding (llama-cpp-python, the `peer` extra, in this process)")
    p.add_argument("--rows", metavar="M,M,...", default=None,
                   help="instead: tokens per second of row-wise calls of M rows after the prompt (verify cost)")
    p.add_argument("--reopen", type=int, metavar="N", default=None,
                   help="instead: time to first token of a stored N-token conversation reopened from its KV "
                        "sidecar versus re-prefilled")
    p.add_argument("--spec", action="store_true",
                   help="instead: plain and speculative replies to chat workloads, timed in the same run; fails "
                        "if any reply differs")
    p.add_argument("--workload", metavar="NAME|FILE", default=None,
                   help="with --spec: one workload, a JSON file or a built-in name (default: every built-in one)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="with --spec: cap every reply at this many tokens (default: the workload's own)")
    p.add_argument("--cold-start", action="store_true",
                   help="instead: seconds from the end of the download to the first token of the first reply, "
                        "with an empty kernel cache, as on a fresh machine (a starter model)")
    p.add_argument("--download-s", type=float, default=0.0,
                   help="with --cold-start: how long the simulated download overlaps the warm-up (default 0)")
    p.add_argument("--no-warmup", action="store_true",
                   help="with --cold-start: no background warm-up; the first reply compiles the kernels")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_stream_options(p)
    add_sampler_options(p)
    p.set_defaults(func=run_bench)
