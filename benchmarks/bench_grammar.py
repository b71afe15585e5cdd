"""Constrained replies against free ones, with and without speculation, on the JSON-schema suite.

    python benchmarks/bench_grammar.py [--model qwen2.5-coder-0.5b-instruct] [--threads 2] [--max-tokens 80]
                                       [--turns 2] [--limit N]

Each schema of tests/data/grammar/json_schemas.json gets a short chat in each of three modes, all greedy and
single-stream, run turn by turn side by side in the same run: the schema's prompt, then "Another one,
please." for every further turn (a follow-up has the first reply's structure to draft from).
- constrained: the grammar's processor, plain decode;
- constrained_spec: the same, decoded speculatively (the grammar-aware draft source, spec 13.9.6); its token
  ids must equal the plain constrained reply's, else the benchmark stops with SpeculationMismatch;
- free: no grammar, each reply capped at the constrained reply's length (a free reply of similar length).
Reported, per mode, over all turns and per turn: decode tok/s (sampled tokens after each reply's first over
the time after the first: the prefill is the same work in every mode); for constrained, the microseconds per
token spent in the grammar processor (mask fill + applying it to the row + committing the token), its share
of the per-token time, and the share of sampled tokens the grammar forced (its mask left one token, the
closing stop token included); for constrained_spec, draft acceptance, tokens per step and the lookaheads'
microseconds per sampled token. The closing logic that keeps a reply closable within --max-tokens
(engine.sampling.budget) is timed apart, inside the mask work: its microseconds per token and share. The last
line is a JSON summary with the bars (constrained_spec >= 1.2x free tok/s; mask <= 5% and closing <= 2% of
the per-token time). Reports only: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.platform.catalog import resolve_model  # noqa: E402
from engine.chat import ChatOptions, Conversation, TurnResult, template_for_model  # noqa: E402
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
CLOSING_SHARE_BAR = 0.02  # the budget's closing logic over the per-token time (part of the mask work)
FOLLOW_UP = "Another one, please."
MODES = ("free", "constrained", "constrained_spec")
CAPACITY = 512  # KV positions per chat: a prompt and a few replies
SPEC_COUNTS = ("steps", "drafted", "accepted", "committed")  # the decoder's Stats summed over replies


class Timed(StructuredProcessor):
    """Times the wrapped processor's hooks; with `count_forced`, counts the steps whose mask left one token
    (outside the timed part, and off in the speculative runs, whose speed is compared)."""

    def __init__(self, inner: StructuredProcessor, count_forced: bool = False, closing: bool = True):
        self.inner, self.count_forced, self.closing = inner, count_forced, closing
        self.ns = self.lookahead_ns = self.steps = self.forced = 0
        self.closing_ns = 0  # of the above and beside it: the budget's closing logic (engine.sampling.budget)

    @property
    def closed_early(self):
        return self.inner.closed_early

    def _time(self, counter: str, call, *args):
        """`call(*args)`, its nanoseconds added to the counter named."""
        start = time.perf_counter_ns()
        try:
            return call(*args)
        finally:
            setattr(self, counter, getattr(self, counter) + time.perf_counter_ns() - start)

    def set_budget(self, tokens):
        self._time("closing_ns", self.inner.set_budget, tokens if self.closing else None)
        budget = self.inner.budget
        if budget is not None:  # its hooks, timed where the processor calls them
            for name in ("forcing", "vet", "commit"):
                hook = getattr(budget, name)
                setattr(budget, name, lambda *args, hook=hook: self._time("closing_ns", hook, *args))

    def vet(self, token):
        return self._time("ns", self.inner.vet, token)

    def process(self, logits, history):
        self._time("ns", self.inner.process, logits, history)
        self.steps += 1
        if self.count_forced:
            self.forced += int(np.count_nonzero(logits > -np.inf) == 1)

    def commit(self, token):
        self._time("ns", self.inner.commit, token)

    def reset(self):
        self.inner.reset()

    def forced_tokens(self):
        return self._time("lookahead_ns", self.inner.forced_tokens)

    def valid_prefix_len(self, tokens):
        return self._time("lookahead_ns", self.inner.valid_prefix_len, tokens)


@dataclass
class Mode:
    """One mode's totals over the suite (or over one turn of each schema's chat)."""
    sampled: int = 0      # tokens sampled, the stop tokens included
    timed: int = 0        # of those, the ones after each reply's first (the decode-time numerator)
    decode_s: float = 0.0
    mask_ns: int = 0
    lookahead_ns: int = 0
    closing_ns: int = 0
    forced: int = 0
    closed: int = 0  # replies closed at their limit
    spec: Stats = field(default_factory=Stats)

    def add(self, turn: TurnResult, processor: Timed | None = None, before: tuple[int, ...] = (0, 0, 0, 0)) -> None:
        """A reply; `before`: the processor's counters before it (a chat's processor serves every turn)."""
        sampled = len(turn.token_ids) + (turn.finish_reason in ("stop", "stop_sequence"))
        self.sampled += sampled
        if sampled > 1 and turn.stats.decode_tps:
            self.timed += sampled - 1
            self.decode_s += (sampled - 1) / turn.stats.decode_tps
        if processor is not None:
            self.mask_ns += processor.ns - before[0]
            self.lookahead_ns += processor.lookahead_ns - before[1]
            self.forced += processor.forced - before[2]
            self.closing_ns += processor.closing_ns - before[3]
        self.closed += turn.finish_reason == "length_closed"
        if turn.stats.spec is not None:
            _add(self.spec, turn.stats.spec, SPEC_COUNTS)

    def merge(self, other: "Mode") -> None:
        _add(self, other, ("sampled", "timed", "decode_s", "mask_ns", "lookahead_ns", "closing_ns", "forced",
                           "closed"))
        _add(self.spec, other.spec, SPEC_COUNTS)

    def tok_s(self) -> float:
        return self.timed / self.decode_s if self.decode_s else 0.0

    def us_per_token(self, ns: int) -> float:
        return ns / 1e3 / max(self.sampled, 1)


def _add(total, part, names: tuple[str, ...]) -> None:
    for name in names:
        setattr(total, name, getattr(total, name) + getattr(part, name))


def counters(processor: Timed) -> tuple[int, ...]:
    return processor.ns, processor.lookahead_ns, processor.forced, processor.closing_ns


def chat(model, tokenizer, template, max_tokens: int, processor=None, speculation: bool = False) -> Conversation:
    return Conversation(model, tokenizer, template, ChatOptions(
        capacity=CAPACITY, max_tokens=max_tokens, processor=processor, speculation=speculation))


def send(convo: Conversation, user: str, max_tokens: int | None = None) -> TurnResult:
    if max_tokens is not None:  # this reply's cap (a free reply as long as the constrained one)
        convo.options = dataclasses.replace(convo.options, max_tokens=max_tokens)
    "".join(convo.send(user))
    return convo.last_turn


def check_same(name: str, turn: int, plain: list[int], spec: list[int]) -> None:
    if plain != spec:
        at = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), min(len(plain), len(spec)))
        raise SpeculationMismatch(f"schema {name!r}, turn {turn}: the speculative constrained reply differs from "
                                  f"the plain one at token {at} ({len(spec)} vs {len(plain)} tokens)")


def run_case(model, tokenizer, template, stop: int, case: dict, users: list[str], max_tokens: int,
             totals: list[dict[str, Mode]], closing: bool = True) -> None:
    """One schema's chat in the three modes, turn by turn; each turn's figures go to totals[turn]."""
    grammar = Grammar("json_schema", json.dumps(case["schema"]))
    timed = Timed(grammar_processor(grammar, tokenizer, stop), count_forced=True, closing=closing)
    timed_spec = Timed(grammar_processor(grammar, tokenizer, stop), closing=closing)
    plain = chat(model, tokenizer, template, max_tokens, timed)
    fast = chat(model, tokenizer, template, max_tokens, timed_spec, speculation=True)
    free = chat(model, tokenizer, template, max_tokens)
    for i, user in enumerate(users):
        modes = totals[i]
        before, before_spec = counters(timed), counters(timed_spec)
        p = send(plain, user)
        modes["constrained"].add(p, timed, before)
        s = send(fast, user)
        check_same(case["name"], i + 1, p.token_ids, s.token_ids)
        modes["constrained_spec"].add(s, timed_spec, before_spec)
        modes["free"].add(send(free, user, max(len(p.token_ids), 1)))
        print(f"{case['name']:22} turn {i + 1} {p.finish_reason:6} {len(p.token_ids):3} tokens  "
              f"{p.stats.decode_tps:6.1f} tok/s plain  {s.stats.decode_tps:6.1f} tok/s spec "
              f"({s.stats.spec.tokens_per_step():.2f}/step, {s.stats.spec.accepted}/{s.stats.spec.drafted} accepted)",
              flush=True)


def summary(modes: dict[str, Mode]) -> dict:
    free, constrained, spec_mode = modes["free"], modes["constrained"], modes["constrained_spec"]
    mask_us = constrained.us_per_token(constrained.mask_ns)
    per_token_us = 1e6 / constrained.tok_s() if constrained.tok_s() else 0.0
    share = mask_us / per_token_us if per_token_us else None
    closing_us = constrained.us_per_token(constrained.closing_ns)
    closing_share = closing_us / per_token_us if per_token_us else None
    spec = spec_mode.spec
    speedup = spec_mode.tok_s() / free.tok_s() if free.tok_s() else None
    return {
        "free": {"tok_s": free.tok_s(), "sampled": free.sampled},
        "constrained": {"tok_s": constrained.tok_s(), "sampled": constrained.sampled, "mask_us_per_token": mask_us,
                        "mask_share": share, "forced_share": constrained.forced / max(constrained.sampled, 1),
                        "closing_us_per_token": closing_us, "closing_share": closing_share,
                        "closed_at_limit": constrained.closed},
        "constrained_spec": {"tok_s": spec_mode.tok_s(), "steps": spec.steps, "drafted": spec.drafted,
                             "accepted": spec.accepted, "acceptance": spec.acceptance_rate(),
                             "tokens_per_step": spec.tokens_per_step(),
                             "mask_us_per_token": spec_mode.us_per_token(spec_mode.mask_ns),
                             "lookahead_us_per_token": spec_mode.us_per_token(spec_mode.lookahead_ns)},
        "bars": {"spec_vs_free": speedup, "spec_vs_free_ok": speedup is not None and speedup >= SPEED_BAR,
                 "constrained_vs_free": constrained.tok_s() / free.tok_s() if free.tok_s() else None,
                 "mask_share_ok": share is not None and share <= MASK_SHARE_BAR,
                 "closing_share_ok": closing_share is not None and closing_share <= CLOSING_SHARE_BAR},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=80)
    ap.add_argument("--turns", type=int, default=2,
                    help=f"replies per schema's chat (the later ones answer {FOLLOW_UP!r})")
    ap.add_argument("--limit", type=int, default=None, help="only the first N schemas")
    ap.add_argument("--no-closing", action="store_true",
                    help="constrained replies without a closable budget (the closing logic's A/B)")
    args = ap.parse_args()
    if args.turns < 1:
        ap.error("--turns must be at least 1")
    threads = configure_threads(args.threads)
    cases = json.loads((ROOT / "tests" / "data" / "grammar" / "json_schemas.json").read_text())[: args.limit]
    model = load_model(resolve_model(args.model))
    model.rows_ready(model.new_cache(1), wait=True)  # speculation's verify kernels, before any reply is timed
    tokenizer = load_tokenizer(model.file.metadata)
    template = template_for_model(model.file.metadata, tokenizer)
    stop = stop_token_id(tokenizer, template)
    totals = [{name: Mode() for name in MODES} for _ in range(args.turns)]
    for case in cases:
        run_case(model, tokenizer, template, stop, case, [case["prompt"]] + [FOLLOW_UP] * (args.turns - 1),
                 args.max_tokens, totals, closing=not args.no_closing)
    overall = {name: Mode() for name in MODES}
    for modes in totals:
        for name in MODES:
            overall[name].merge(modes[name])
    result = {"model": args.model, "threads": threads, "schemas": len(cases), "closing": not args.no_closing,
              "outputs_equal": True,  # else SpeculationMismatch stopped the run
              "all_turns": summary(overall), "per_turn": [summary(modes) for modes in totals]}
    labelled = [("all turns", result["all_turns"])] + [(f"turn {i + 1}", r) for i, r in enumerate(result["per_turn"])]
    for label, r in labelled:
        c, s = r["constrained"], r["constrained_spec"]
        print(f"{label}: free {r['free']['tok_s']:.1f} tok/s, constrained {c['tok_s']:.1f}, constrained+spec "
              f"{s['tok_s']:.1f} ({r['bars']['spec_vs_free'] or 0:.2f}x free); mask {c['mask_us_per_token']:.1f} "
              f"us/token = {100 * (c['mask_share'] or 0):.2f}%, of which closing {c['closing_us_per_token']:.1f} us "
              f"= {100 * (c['closing_share'] or 0):.2f}% ({c['closed_at_limit']} replies closed at the limit); "
              f"forced {100 * c['forced_share']:.1f}%; acceptance "
              f"{100 * s['acceptance']:.0f}% at {s['tokens_per_step']:.2f} tokens/step")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
