"""Grammar mask cost per token against the decode time per token, on the JSON-schema suite.

    python benchmarks/bench_grammar.py [--model smollm2-135m-instruct] [--max-tokens 80] [--limit N]

Each schema of tests/data/grammar/json_schemas.json gets one greedy single-stream reply (no speculation).
Reported: the mean microseconds per token spent in the grammar processor (mask fill + applying it to the
logits row + committing the token), the mean decode time per token (TurnStats.decode_tps, mask included),
the mask's share of it, and the share of sampled tokens the grammar forced (its mask allowed exactly one
token; the closing stop token included). Reports only: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.catalog import resolve_model  # noqa: E402
from engine.chat import ChatOptions, Conversation, template_for_model  # noqa: E402
from engine.chat.model_template import stop_token_id  # noqa: E402
from engine.models import load_model  # noqa: E402
from engine.sampling import LogitProcessor  # noqa: E402
from engine.sampling.grammar import Grammar, grammar_processor  # noqa: E402
from engine.tokenize import load_tokenizer  # noqa: E402


class Timed(LogitProcessor):
    """Times the wrapped processor's hooks and counts the steps whose mask left one token."""

    def __init__(self, inner: LogitProcessor):
        self.inner, self.ns, self.steps, self.forced = inner, 0, 0, 0

    def process(self, logits, history):
        start = time.perf_counter_ns()
        self.inner.process(logits, history)
        self.ns += time.perf_counter_ns() - start
        self.steps += 1
        self.forced += int(np.count_nonzero(logits > -np.inf) == 1)  # outside the timed part

    def commit(self, token):
        start = time.perf_counter_ns()
        self.inner.commit(token)
        self.ns += time.perf_counter_ns() - start

    def reset(self):
        self.inner.reset()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--max-tokens", type=int, default=80)
    ap.add_argument("--limit", type=int, default=None, help="only the first N schemas")
    args = ap.parse_args()
    cases = json.loads((ROOT / "tests" / "data" / "grammar" / "json_schemas.json").read_text())[: args.limit]
    model = load_model(resolve_model(args.model))
    tokenizer = load_tokenizer(model.file.metadata)
    template = template_for_model(model.file.metadata, tokenizer)
    mask_ns = steps = forced = tokens = 0
    decode_s = 0.0
    for case in cases:
        grammar = Grammar("json_schema", json.dumps(case["schema"]))
        timed = Timed(grammar_processor(grammar, tokenizer, stop_token_id(tokenizer, template)))
        convo = Conversation(model, tokenizer, template, ChatOptions(
            capacity=256, max_tokens=args.max_tokens, processor=timed))
        "".join(convo.send(case["prompt"]))
        turn = convo.last_turn
        sampled = timed.steps
        mask_ns, steps, forced = mask_ns + timed.ns, steps + sampled, forced + timed.forced
        tokens += len(turn.token_ids)
        if sampled > 1 and turn.stats.decode_tps:
            decode_s += (sampled - 1) / turn.stats.decode_tps
        print(f"{case['name']:22} {turn.finish_reason:6} {sampled:3} steps  "
              f"{timed.ns / 1e3 / max(sampled, 1):7.1f} us/token mask  {turn.stats.decode_tps:6.1f} tok/s",
              flush=True)
    mask_us = mask_ns / 1e3 / steps
    decode_us = decode_s * 1e6 / max(steps - len(cases), 1)
    print(f"\n{args.model}: {len(cases)} schemas, {steps} sampled tokens ({tokens} reply tokens)")
    print(f"mask work {mask_us:.1f} us/token; decode {decode_us / 1e3:.1f} ms/token; "
          f"mask share {100 * mask_us / decode_us:.2f}%")
    print(f"forced tokens (mask left one): {forced}/{steps} = {100 * forced / steps:.1f}%")


if __name__ == "__main__":
    main()
