"""Constrained replies against free ones, with and without speculation, on the JSON-schema suite.

    python benchmarks/bench_grammar.py [--model qwen2.5-coder-0.5b-instruct] [--threads 2] [--max-tokens 80]
                                       [--limit N]

Each schema of tests/data/grammar/json_schemas.json gets, in this order and in the same run, one greedy
single-stream reply in each mode:
- constrained: the grammar's processor, plain decode;
- constrained+spec: the same, decoded speculatively (the grammar-aware draft source, spec 13.9.6); its token
  ids must equal the plain constrained reply's, else the benchmark stops with SpeculationMismatch;
- free: no grammar, capped at the constrained reply's length (a free reply of similar length).
Reported, per mode: decode tok/s (sampled tokens after the first over the time after the first: the prefill
is the same work in every mode); for constrained, the microseconds per token spent in the grammar processor
(mask fill + applying it to the row + committing the token), its share of the per-token time, and the share
of sampled tokens the grammar forced (its mask left one token, the closing stop token included); for
constrained+spec, draft acceptance, tokens per step and the lookaheads' microseconds per sampled token. The
last line is a JSON summary with the issue's two bars. Reports only: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.catalog import resolve_model  # noqa: E402
from engine.chat import ChatOptions, Conversation, template_for_model  # noqa: E402
from engine.chat.model_template import stop_token_id  # noqa: E402
from engine.errors import SpeculationMismatch  # noqa: E402
from engine.models import load_model  # noqa: E402
from engine.runtime import configure_threads  # noqa: E402
from engine.sampling.grammar import Grammar, grammar_processor  # noqa: E402
from engine.sampling.processor import StructuredProcessor  # noqa: E402
from engine.speculative import Stats  # noqa: E402
from engine.tokenize import load_tokenizer  # noqa: E402

SPEED_BAR = 1.2        # constrained+spec tok/s over free tok/s
MASK_SHARE_BAR = 0.05  # mask work over the per-token time, plain constrained decode


class Timed(StructuredProcessor):
    """Times the wrapped processor's hooks; with `count_forced`, counts the steps whose mask left one token
    (outside the timed part, and off in the speculative runs, whose speed is compared)."""

    def __init__(self, inner: StructuredProcessor, count_forced: bool = False):
        self.inner, self.count_forced = inner, count_forced
        self.ns = self.lookahead_ns = self.steps = self.forced = 0

    def process(self, logits, history):
        start = time.perf_counter_ns()
        self.inner.process(logits, history)
        self.ns += time.perf_counter_ns() - start
        self.steps += 1
        if self.count_forced:
            self.forced += int(np.count_nonzero(logits > -np.inf) == 1)

    def commit(self, token):
        start = time.perf_counter_ns()
        self.inner.commit(token)
        self.ns += time.perf_counter_ns() - start

    def reset(self):
        self.inner.reset()

    def forced_tokens(self):
        start = time.perf_counter_ns()
        try:
            return self.inner.forced_tokens()
        finally:
            self.lookahead_ns += time.perf_counter_ns() - start

    def valid_prefix_len(self, tokens):
        start = time.perf_counter_ns()
        try:
            return self.inner.valid_prefix_len(tokens)
        finally:
            self.lookahead_ns += time.perf_counter_ns() - start


@dataclass
class Mode:
    """One mode's totals over the suite."""
    sampled: int = 0      # tokens sampled, the stop tokens included
    timed: int = 0        # of those, the ones after each reply's first (the decode-time numerator)
    decode_s: float = 0.0
    mask_ns: int = 0
    lookahead_ns: int = 0
    forced: int = 0

    def add(self, convo: Conversation, timed: Timed | None = None) -> None:
        turn = convo.last_turn
        sampled = len(turn.token_ids) + (turn.finish_reason in ("stop", "stop_sequence"))
        self.sampled += sampled
        if sampled > 1 and turn.stats.decode_tps:
            self.timed += sampled - 1
            self.decode_s += (sampled - 1) / turn.stats.decode_tps
        if timed is not None:
            self.mask_ns, self.lookahead_ns = self.mask_ns + timed.ns, self.lookahead_ns + timed.lookahead_ns
            self.forced += timed.forced

    def tok_s(self) -> float:
        return self.timed / self.decode_s if self.decode_s else 0.0

    def us_per_token(self, ns: int) -> float:
        return ns / 1e3 / max(self.sampled, 1)


def reply(model, tokenizer, template, prompt: str, max_tokens: int, processor=None,
          speculation: bool = False) -> Conversation:
    convo = Conversation(model, tokenizer, template, ChatOptions(
        capacity=256, max_tokens=max_tokens, processor=processor, speculation=speculation))
    "".join(convo.send(prompt))
    return convo


def check_same(name: str, plain: list[int], spec: list[int]) -> None:
    if plain != spec:
        at = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), min(len(plain), len(spec)))
        raise SpeculationMismatch(f"schema {name!r}: the speculative constrained reply differs from the plain one "
                                  f"at token {at} ({len(spec)} vs {len(plain)} tokens)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=80)
    ap.add_argument("--limit", type=int, default=None, help="only the first N schemas")
    args = ap.parse_args()
    threads = configure_threads(args.threads)
    cases = json.loads((ROOT / "tests" / "data" / "grammar" / "json_schemas.json").read_text())[: args.limit]
    model = load_model(resolve_model(args.model))
    tokenizer = load_tokenizer(model.file.metadata)
    template = template_for_model(model.file.metadata, tokenizer)
    stop = stop_token_id(tokenizer, template)
    constrained, spec_mode, free = Mode(), Mode(), Mode()
    spec = Stats()
    for case in cases:
        grammar = Grammar("json_schema", json.dumps(case["schema"]))
        timed = Timed(grammar_processor(grammar, tokenizer, stop), count_forced=True)
        plain = reply(model, tokenizer, template, case["prompt"], args.max_tokens, timed)
        constrained.add(plain, timed)
        timed_spec = Timed(grammar_processor(grammar, tokenizer, stop))
        fast = reply(model, tokenizer, template, case["prompt"], args.max_tokens, timed_spec, speculation=True)
        check_same(case["name"], plain.last_turn.token_ids, fast.last_turn.token_ids)
        spec_mode.add(fast, timed_spec)
        s = fast.last_turn.stats.spec
        for name in ("steps", "drafted", "accepted", "committed"):
            setattr(spec, name, getattr(spec, name) + getattr(s, name))
        free.add(reply(model, tokenizer, template, case["prompt"], max(len(plain.last_turn.token_ids), 1)))
        print(f"{case['name']:22} {plain.last_turn.finish_reason:6} {timed.steps:3} tokens  "
              f"{plain.last_turn.stats.decode_tps:6.1f} tok/s plain  {fast.last_turn.stats.decode_tps:6.1f} "
              f"tok/s spec ({s.tokens_per_step():.2f}/step, {s.accepted}/{s.drafted} accepted)", flush=True)

    mask_us = constrained.us_per_token(constrained.mask_ns)
    per_token_us = 1e6 / constrained.tok_s() if constrained.tok_s() else 0.0
    result = {
        "model": args.model, "threads": threads, "schemas": len(cases),
        "free": {"tok_s": free.tok_s(), "sampled": free.sampled},
        "constrained": {"tok_s": constrained.tok_s(), "sampled": constrained.sampled,
                        "mask_us_per_token": mask_us,
                        "mask_share": mask_us / per_token_us if per_token_us else None,
                        "forced_share": constrained.forced / max(constrained.sampled, 1)},
        "constrained_spec": {"tok_s": spec_mode.tok_s(), "steps": spec.steps, "drafted": spec.drafted,
                             "accepted": spec.accepted, "acceptance": spec.acceptance_rate(),
                             "tokens_per_step": spec.tokens_per_step(),
                             "mask_us_per_token": spec_mode.us_per_token(spec_mode.mask_ns),
                             "lookahead_us_per_token": spec_mode.us_per_token(spec_mode.lookahead_ns)},
        "outputs_equal": True,  # else SpeculationMismatch stopped the run
    }
    speedup = spec_mode.tok_s() / free.tok_s() if free.tok_s() else None
    share = result["constrained"]["mask_share"]
    result["bars"] = {"spec_vs_free": speedup, "spec_vs_free_ok": speedup is not None and speedup >= SPEED_BAR,
                      "constrained_vs_free": constrained.tok_s() / free.tok_s() if free.tok_s() else None,
                      "mask_share_ok": share is not None and share <= MASK_SHARE_BAR}
    print(f"\n{args.model}, {threads} threads: {len(cases)} schemas; free {free.tok_s():.1f} tok/s, constrained "
          f"{constrained.tok_s():.1f}, constrained+spec {spec_mode.tok_s():.1f} tok/s")
    print(f"mask work {mask_us:.1f} us/token = {100 * (share or 0):.2f}% of the per-token time; forced tokens "
          f"{100 * result['constrained']['forced_share']:.1f}%; draft acceptance {100 * spec.acceptance_rate():.0f}% "
          f"at {spec.tokens_per_step():.2f} tokens/step")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
