"""`fucina bench`: throughput, latency, load time and memory, optionally beside llama.cpp."""

from __future__ import annotations

import json
import sys

from app.cli_eval import resolve_model_path
from engine.bench import benchmark
from engine.runtime import configure_threads


def run_bench(args) -> int:
    threads = configure_threads(args.threads)
    path = resolve_model_path(args.model)
    log = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    r = benchmark(str(path), threads, args.prompt_tokens, args.gen_tokens, args.runs, args.peer, log)
    if args.json:
        json.dump(r, sys.stdout, indent=1)
        print()
        return 0
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
            line += (f" | llama.cpp {p['median']:8.2f} | ratio {q['median']:.2f}x "
                     f"(min {q['min']:.2f}, max {q['max']:.2f})")
        print(line)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="measure prefill/decode speed, optionally against llama.cpp")
    p.add_argument("model", help="a starter model name or a path to a .gguf file")
    p.add_argument("--threads", type=int, default=None, help="kernel threads (default: $FUCINA_THREADS or all cores)")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--peer", action="store_true", help="also run llama.cpp (the `peer` extra) in the same process")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run_bench)
