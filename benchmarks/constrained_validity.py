"""Constrained replies valid every time: the real-world schema suite under token budgets.

    python benchmarks/constrained_validity.py [--model NAME ...] [--budgets 64,128,300] [--seeds greedy,1]
                                              [--limit N] [--threads 2] [--out FILE.json]

Measured results are in BENCHMARKS.md ("Constrained replies").

Every schema of benchmarks/schemas/ (OpenAPI components, tool parameters, configuration files, forms; each
file its prompt, its source and the schema) is asked for once per model, budget and sampling mode (greedy,
or the chat defaults with a seed) as a one-turn chat. Each reply is checked:
- it parses as JSON and takes at most the budget's tokens;
- it validates against the schema except for the keywords the grammar reported as not enforced while
  writing (engine.sampling.json_schema): any other violation is a failure;
- the reply's schema warnings are exactly its violations of those keywords (each keyword at each path).
At each schema's own edge, greedy: a budget of exactly its shortest document must give a valid reply, and
one token less must be refused before any token is written (counted apart).
Prints one line per reply and a summary; --out writes every reply. Exits 1 when any reply fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jsonschema  # noqa: E402

from engine.platform.catalog import resolve_model  # noqa: E402
from engine.chat.conversation import ChatOptions, Conversation  # noqa: E402
from engine.errors import ReplyBudgetTooSmall  # noqa: E402
from engine.models import load_model  # noqa: E402
from engine.runtime import configure_threads  # noqa: E402
from engine.sampling import SamplerConfig  # noqa: E402
from engine.sampling.grammar import Grammar, grammar_processor  # noqa: E402
from engine.sampling.json_schema import check_reply  # noqa: E402
from engine.sampling.sampler import CHAT_DEFAULTS  # noqa: E402
from engine.tokenize import load_tokenizer  # noqa: E402

SCHEMAS = ROOT / "benchmarks" / "schemas"
MODELS = ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct")


def load_suite(limit: int | None = None) -> list[tuple[str, dict]]:
    files = sorted(SCHEMAS.glob("*.json"))[:limit]
    return [(f.stem, json.loads(f.read_text())) for f in files]


def check(case: dict, grammar: Grammar, text: str, tokens: int, budget: int, warnings: tuple[str, ...]) -> str | None:
    """Why the reply fails the suite's bars, or None."""
    if tokens > budget:
        return f"{tokens} tokens, over the budget of {budget}"
    try:
        value = json.loads(text)
    except ValueError as e:
        return f"not JSON: {e}"
    schema = case["schema"]
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    errors = list(validator(schema, format_checker=validator.FORMAT_CHECKER).iter_errors(value))
    expected = sorted(map(str, check_reply(schema, text, grammar.unenforced)))
    if sorted(warnings) != expected:
        return f"reported {list(warnings)}, expected {expected}"
    for error in errors:
        if not _unenforced(error, grammar.unenforced):
            return f"breaks an enforced keyword: {error.json_path}: {error.message} ({error.validator})"
    return None


def _unenforced(error, keywords: tuple[str, ...]) -> bool:
    """The error comes from a keyword the grammar did not enforce (anywhere on its schema path, or on one
    of an anyOf's failing branches)."""
    path = [str(p) for p in error.absolute_schema_path]
    if any(k in keywords for k in path):
        return True
    if error.validator == "format" and f"format: {error.validator_value}" in keywords:
        return True
    return any(_unenforced(e, keywords) for e in error.context or ())


def shortest_reply(grammar: Grammar, tokenizer) -> int:
    """The tokens of the grammar's shortest document (what a budget must at least be)."""
    processor = grammar_processor(grammar, tokenizer)
    processor.set_budget(1 << 20)
    return processor.budget.minimal


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", help=f"starter model (default: {', '.join(MODELS)})")
    p.add_argument("--budgets", default="64,128,300", help='token limits ("": only each schema\'s edge)')
    p.add_argument("--seeds", default="greedy,1", help="greedy and/or seeds for the chat defaults")
    p.add_argument("--limit", type=int, default=None, help="the first N schemas only")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", help="write every reply to this JSON file")
    args = p.parse_args()
    configure_threads(args.threads)
    budgets = [int(b) for b in args.budgets.split(",") if b]  # "": only each schema's edge
    modes = args.seeds.split(",")
    suite = load_suite(args.limit)
    rows, failures, refused = [], 0, 0
    for name in args.model or MODELS:
        model = load_model(resolve_model(name, pull_missing=True))
        tokenizer = load_tokenizer(model.file.metadata)
        for stem, case in suite:
            grammar = Grammar("json_schema", json.dumps(case["schema"]))
            shortest = shortest_reply(grammar, tokenizer)
            runs = [(b, m) for b in budgets for m in modes] + [(shortest - 1, "greedy"), (shortest, "greedy")]
            for budget, mode in runs:
                sampler = SamplerConfig() if mode == "greedy" else replace(CHAT_DEFAULTS, seed=int(mode))
                convo = Conversation.for_model(model, ChatOptions(
                    capacity=1024, max_tokens=budget, sampler=sampler, grammar=grammar), tokenizer=tokenizer)
                start = time.perf_counter()
                try:
                    for _ in convo.send(case["prompt"]):
                        pass
                except ReplyBudgetTooSmall as e:
                    refused += 1
                    ok = budget < shortest and convo.history == []
                    failures += not ok
                    print(f"{name} {stem} budget={budget} {mode}: refused before any token ({e})"
                          f"{'' if ok else ' FAIL: refused at or above the shortest document'}")
                    continue
                if budget < shortest:
                    failures += 1
                    print(f"{name} {stem} budget={budget}: FAIL: not refused below the shortest document")
                turn = convo.last_turn
                why = check(case, grammar, turn.text, len(turn.token_ids), budget, turn.schema_warnings)
                failures += why is not None
                row = {"model": name, "schema": stem, "budget": budget, "mode": mode,
                       "tokens": len(turn.token_ids), "finish": turn.finish_reason,
                       "warnings": list(turn.schema_warnings), "ok": why is None, "why": why,
                       "seconds": round(time.perf_counter() - start, 2), "text": turn.text}
                rows.append(row)
                print(f"{name} {stem} budget={budget} {mode}: {len(turn.token_ids)} tokens, "
                      f"{turn.finish_reason}, {len(turn.schema_warnings)} warnings, "
                      f"{'ok' if why is None else 'FAIL: ' + why}", flush=True)
    valid = sum(r["ok"] for r in rows)
    summary = {"replies": len(rows), "valid": valid, "failures": failures, "refused_before_generating": refused,
               "closed_at_limit": sum(r["finish"] == "length_closed" for r in rows),
               "with_warnings": sum(bool(r["warnings"]) for r in rows)}
    print(json.dumps(summary))
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "replies": rows}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
