"""Constrained tool calls against free replies, with and without speculation, on the tool suite.

    python -m benchmarks.bench_tool_calls [--model qwen2.5-coder-0.5b-instruct] [--threads 2]
                                          [--max-tokens 160] [--choice named|required|auto] [--limit N]

Each case of tests/data/tools/tool_suite.json (its prompt and its one tool) gets one reply in each of three
modes, greedy and single-stream, side by side in the same run:
- call: the tool offered (rendered through the model's template) with the case's tool_choice; once the call
  opens, its arguments are held to the tool's JSON schema (engine.chat.tool_constraint); plain decode;
- call_spec: the same, decoded speculatively (the grammar-aware draft source: the call's forced spans draft
  themselves); its token ids must equal the plain call's, else the benchmark stops with SpeculationMismatch;
- free: the same prompt with no tools, the reply capped at the call's length (free text of similar length);
- free_spec: the same free reply decoded speculatively (the app's default for every reply), for comparison.
`--choice named` (the default) names the case's tool, as an agent forcing a call does; `required` asks for a
call of any offered tool; `auto` lets the model decide whether to call (its replies may be words).
Reported: decode tok/s per mode (sampled tokens after each reply's first over the time after the first: the
prefills differ by the rendered tools, not by decoding), the replies that made a call, draft acceptance and
tokens per step. The last line is a JSON summary with the bar (call_spec >= 1.0x free tok/s) and call_spec
against free_spec. Reports only: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json

from benchmarks.bench_grammar import ROOT, Mode, check_same, send
from engine.chat import ChatOptions, Conversation, template_for_model
from engine.chat.tool_use import ToolUse, specs_from_openai
from engine.models import load_model
from engine.platform.catalog import resolve_model
from engine.runtime import configure_threads
from engine.tokenize import load_tokenizer

SPEED_BAR = 1.0  # call_spec tok/s over free tok/s
MODES = ("free", "free_spec", "call", "call_spec")
CAPACITY = 1024  # KV positions per chat: the rendered tool, a prompt and one reply


def run_case(model, tokenizer, template, case: dict, choice: str, max_tokens: int,
             modes: dict[str, Mode]) -> bool:
    """One case's reply in the three modes; True when the call mode's reply made a call."""
    spec = specs_from_openai([case["tool"]])
    tools = ToolUse(spec, spec[0].name if choice == "named" else choice)

    def chat(**options) -> Conversation:
        return Conversation(model, tokenizer, template,
                            ChatOptions(capacity=CAPACITY, max_tokens=max_tokens, **options))

    call = send(chat(tools=tools), case["prompt"])
    modes["call"].add(call)
    fast = send(chat(tools=tools, speculation=True), case["prompt"])
    check_same(spec[0].name, 1, call.token_ids, fast.token_ids)
    modes["call_spec"].add(fast)
    length = max(len(call.token_ids), 1)
    modes["free"].add(send(chat(), case["prompt"], length))
    modes["free_spec"].add(send(chat(speculation=True), case["prompt"], length))
    steps = fast.stats.spec
    print(f"{spec[0].name:24} {'call' if call.tool_calls else 'text':4} {len(call.token_ids):3} tokens  "
          f"{call.stats.decode_tps:6.1f} tok/s plain  {fast.stats.decode_tps:6.1f} tok/s spec "
          f"({steps.tokens_per_step():.2f}/step, {steps.accepted}/{steps.drafted} accepted)", flush=True)
    return bool(call.tool_calls)


def summary(modes: dict[str, Mode], calls: int, cases: int) -> dict:
    free, free_fast, call, fast = (modes[name] for name in MODES)
    speedup = fast.tok_s() / free.tok_s() if free.tok_s() else None
    return {
        "cases": cases, "calls": calls,
        "free": {"tok_s": free.tok_s(), "sampled": free.sampled},
        "free_spec": {"tok_s": free_fast.tok_s(), "sampled": free_fast.sampled,
                      "tokens_per_step": free_fast.spec.tokens_per_step()},
        "call": {"tok_s": call.tok_s(), "sampled": call.sampled, "closed_at_limit": call.closed},
        "call_spec": {"tok_s": fast.tok_s(), "steps": fast.spec.steps, "drafted": fast.spec.drafted,
                      "accepted": fast.spec.accepted, "acceptance": fast.spec.acceptance_rate(),
                      "tokens_per_step": fast.spec.tokens_per_step()},
        "bars": {"spec_vs_free": speedup, "spec_vs_free_ok": speedup is not None and speedup >= SPEED_BAR,
                 "call_vs_free": call.tok_s() / free.tok_s() if free.tok_s() else None,
                 "spec_vs_free_spec": fast.tok_s() / free_fast.tok_s() if free_fast.tok_s() else None},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--choice", default="named", choices=("named", "required", "auto"))
    ap.add_argument("--limit", type=int, default=None, help="only the first N cases")
    args = ap.parse_args()
    threads = configure_threads(args.threads)
    cases = json.loads((ROOT / "tests" / "data" / "tools" / "tool_suite.json").read_text())[: args.limit]
    model = load_model(resolve_model(args.model))
    model.rows_ready(model.new_cache(1), wait=True)  # speculation's verify kernels, before any reply is timed
    tokenizer = load_tokenizer(model.file.metadata)
    template = template_for_model(model.file.metadata, tokenizer)
    modes = {name: Mode() for name in MODES}
    calls = sum(run_case(model, tokenizer, template, case, args.choice, args.max_tokens, modes) for case in cases)
    result = {"model": args.model, "threads": threads, "choice": args.choice,
              "outputs_equal": True,  # else SpeculationMismatch stopped the run
              **summary(modes, calls, len(cases))}
    print(f"free {result['free']['tok_s']:.1f} tok/s (speculative {result['free_spec']['tok_s']:.1f}), "
          f"call {result['call']['tok_s']:.1f}, call+spec "
          f"{result['call_spec']['tok_s']:.1f} ({result['bars']['spec_vs_free'] or 0:.2f}x free, "
          f"{result['bars']['spec_vs_free_spec'] or 0:.2f}x free speculative); "
          f"{calls}/{len(cases)} replies called; acceptance {100 * result['call_spec']['acceptance']:.0f}% at "
          f"{result['call_spec']['tokens_per_step']:.2f} tokens/step")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
