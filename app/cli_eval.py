"""`fucina eval` and `fucina generate`: scriptable access to the model's logits and greedy output."""

from __future__ import annotations

import json
import sys

import numpy as np

from app.cli_models import ProgressBar
from engine import generate
from engine.catalog import resolve_model
from engine.errors import FucinaError
from engine.models import load_model
from engine.runtime import configure_threads


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise FucinaError(f"token ids must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise FucinaError("no token ids given")
    return ids


def add_model_options(p) -> None:
    p.add_argument("model", help="a starter model name or a path to a .gguf file")
    p.add_argument("--threads", type=int, default=None, help="kernel threads (default: $FUCINA_THREADS or all cores)")
    p.add_argument("--kv", choices=["f16", "q8_0"], default="f16", help="KV cache type")


def resolve_model_path(name: str):
    """A starter name or .gguf path -> the file; a starter model not yet downloaded is pulled first."""
    with ProgressBar() as bar:
        return resolve_model(name, pull_missing=True, progress=bar)


def open_model(args):
    configure_threads(args.threads)
    return load_model(resolve_model_path(args.model))


def run_eval(args) -> int:
    ids = parse_ids(args.ids)
    model = open_model(args)
    rows = []
    for logits in generate.teacher_forced(model, ids, args.kv):
        top_ids, top_vals = generate.top_k(logits, args.top)
        rows.extend({"top_ids": i.tolist(), "top_logits": [round(float(v), 5) for v in l]}
                    for i, l in zip(top_ids, top_vals))
    if args.json:
        json.dump({"ids": ids, "positions": rows}, sys.stdout)
        print()
    else:
        for pos, (tok, row) in enumerate(zip(ids, rows)):
            pairs = " ".join(f"{i}:{v:.3f}" for i, v in zip(row["top_ids"], row["top_logits"]))
            print(f"{pos:5d} {tok:7d} -> {pairs}")
    return 0


def run_generate(args) -> int:
    prompt = parse_ids(args.prompt_ids)
    model = open_model(args)
    stops = [] if args.no_stop else _eos_ids(model)
    out = []
    for tok in generate.greedy(model, prompt, args.max_tokens, stops, args.kv):
        out.append(tok)
        if not args.json:
            print(tok, end=" ", flush=True)
    if args.json:
        json.dump({"prompt_ids": prompt, "ids": out}, sys.stdout)
    print()
    return 0


def _eos_ids(model) -> list[int]:
    eos = model.file.metadata.get("tokenizer.ggml.eos_token_id")
    return [int(eos)] if isinstance(eos, (int, np.integer)) else []


def register(subparsers) -> None:
    p = subparsers.add_parser("eval", help="teacher-forced top-k logits at every position")
    add_model_options(p)
    p.add_argument("--ids", required=True, help="comma-separated token ids")
    p.add_argument("--top", type=int, default=10, help="how many logits per position (default 10)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run_eval)

    p = subparsers.add_parser("generate", help="greedy continuation of a prompt")
    add_model_options(p)
    p.add_argument("--prompt-ids", required=True, help="comma-separated prompt token ids")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--no-stop", action="store_true", help="do not stop at the end-of-sequence token")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run_generate)
