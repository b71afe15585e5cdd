"""Speculative decoding benchmark (spec 13.9): plain and speculative replies to the same chat workloads,
timed in the same run, alternating, so both see the same machine state.

A workload is a JSON file: {"name", "description", "max_tokens", "turns": [user message, ...],
"system": optional, "edits": optional [[old, new], ...]}. In a turn, "{previous}" stands for the previous
reply with each edit applied once (a user pasting the answer back with small changes). Every run sends
each turn to a fresh plain and a fresh speculative conversation with the same seeded sampler (and, for a
model with a next-token-prediction layer, a third speculating with the n-gram cascade alone: the layer's
drafts measured beside it, with the time the layer took); their token ids must be identical turn by turn,
else SpeculationMismatch. Decode speed counts each reply's tokens after the first over the time after the
first (the prefill is the same work on every side).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engine.benchmarks.peer import summary
from engine.chat import ChatOptions, Conversation
from engine.errors import BenchWorkloadError, SpeculationMismatch
from engine.models.model import Model
from engine.sampling import SamplerConfig
from engine.speculative import Stats
from engine.speculative.verify_costs import verify_cost_table
from engine.tokenize import Tokenizer, load_tokenizer

PREVIOUS = "{previous}"
CAPACITY = 8192  # KV positions per conversation: a workload's prompts and replies, all turns


@dataclass(frozen=True)
class Workload:
    name: str
    turns: tuple[str, ...]
    max_tokens: int = 512
    system: str | None = None
    edits: tuple[tuple[str, str], ...] = ()
    description: str = ""

    def user_message(self, turn: int, previous: str) -> str:
        text = self.turns[turn]
        if PREVIOUS not in text:
            return text
        for old, new in self.edits:
            previous = previous.replace(old, new, 1)
        return text.replace(PREVIOUS, previous)


def load_workload(path: str | Path) -> Workload:
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise BenchWorkloadError(f"cannot read the workload {path}: {e.strerror}") from None
    except ValueError as e:
        raise BenchWorkloadError(f"the workload {path} is not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise BenchWorkloadError(f"the workload {path} must be a JSON object")
    turns = raw.get("turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
        raise BenchWorkloadError(f"the workload {path}: `turns` must be a list of non-empty user messages")
    if PREVIOUS in turns[0]:
        raise BenchWorkloadError(f"the workload {path}: the first turn has no previous reply to paste")
    max_tokens = raw.get("max_tokens", Workload.max_tokens)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise BenchWorkloadError(f"the workload {path}: `max_tokens` must be a positive integer")
    edits = raw.get("edits", [])
    if not isinstance(edits, list) or not all(isinstance(e, list) and len(e) == 2 and all(isinstance(s, str) for s in e)
                                              for e in edits):
        raise BenchWorkloadError(f"the workload {path}: `edits` must be a list of [old, new] string pairs")
    system = raw.get("system")
    if system is not None and not isinstance(system, str):
        raise BenchWorkloadError(f"the workload {path}: `system` must be a string")
    return Workload(str(raw.get("name") or path.stem), tuple(turns), max_tokens, system,
                    tuple((old, new) for old, new in edits), str(raw.get("description", "")))


@dataclass
class _Side:
    tokens: int = 0       # decode tokens: each reply's after its first
    decode_s: float = 0.0
    stats: Stats = dataclasses.field(default_factory=Stats)

    def tps(self) -> float:
        return self.tokens / self.decode_s if self.decode_s > 0 else 0.0


def _reply(convo: Conversation, user: str, side: _Side) -> list[int]:
    start = time.perf_counter()
    "".join(convo.send(user))
    total = time.perf_counter() - start
    turn = convo.last_turn
    if turn.finish_reason == "error":
        raise turn.error
    side.tokens += max(turn.stats.generated_tokens - 1, 0)
    side.decode_s += max(total - turn.stats.ttft_ms / 1e3, 0.0)
    if turn.stats.spec is not None:
        for f in dataclasses.fields(Stats):
            setattr(side.stats, f.name, getattr(side.stats, f.name) + getattr(turn.stats.spec, f.name))
    return turn.token_ids


def run_workload(model: Model, workload: Workload, runs: int, *, sampler: SamplerConfig = SamplerConfig(),
                 max_tokens: int | None = None, tokenizer: Tokenizer | None = None,
                 log: Callable[[str], None] = lambda s: None) -> dict:
    """Median plain and speculative decode speed over `runs` runs of `workload`, with the speculative side's
    tokens per step and acceptance; raises SpeculationMismatch when a reply differs. `tokenizer`: the
    model's own unless given."""
    budget = max_tokens or workload.max_tokens
    tokenizer = tokenizer or load_tokenizer(model.file.metadata)  # built once: Qwen's takes a second
    per_run = []
    names = ["plain", "spec", *(["cascade"] if getattr(model, "next_token", None) is not None else [])]
    for run in range(runs):
        sides = {name: _Side() for name in names}
        convos = {name: Conversation.for_model(model, ChatOptions(
            system=workload.system, capacity=min(CAPACITY, model.args.context_length), max_tokens=budget,
            sampler=sampler, speculation=name != "plain", model_drafts=name == "spec"), tokenizer=tokenizer)
            for name in sides}
        previous = ""
        replies = 0
        for i in range(len(workload.turns)):
            user = workload.user_message(i, previous)
            ids = {name: _reply(convos[name], user, sides[name]) for name in sides}
            for name in names[1:]:
                if ids[name] != ids["plain"]:
                    at = next((j for j, (a, b) in enumerate(zip(ids["plain"], ids[name])) if a != b),
                              min(len(ids["plain"]), len(ids[name])))
                    which = "" if name == "spec" else " of the n-gram cascade alone"
                    raise SpeculationMismatch(
                        f"workload {workload.name}, run {run + 1}, turn {i + 1}: the speculative reply{which} "
                        f"differs from the plain one at token {at} ({len(ids[name])} vs {len(ids['plain'])} tokens)")
            previous = convos["plain"].last_turn.text
            replies += len(ids["plain"])
        plain, spec = sides["plain"], sides["spec"]
        per_run.append({"plain_tps": plain.tps(), "spec_tps": spec.tps(),
                        "speedup": spec.tps() / plain.tps() if plain.tps() else 0.0,
                        "tokens_per_step": spec.stats.tokens_per_step(), "acceptance": spec.stats.acceptance_rate(),
                        "reply_tokens": replies, "spec_stats": dataclasses.asdict(spec.stats)})
        line = (f"{workload.name} run {run + 1}/{runs}: plain {plain.tps():.1f} tok/s, speculative {spec.tps():.1f} "
                f"tok/s, {spec.stats.tokens_per_step():.2f} tokens/step, acceptance "
                f"{100 * spec.stats.acceptance_rate():.0f}%")
        if "cascade" in sides:
            per_run[-1] |= _layer_figures(sides["cascade"], spec, convos["spec"])
            r = per_run[-1]
            line += (f"; the n-gram cascade alone {r['cascade_tps']:.1f} tok/s, "
                     f"{r['cascade_tokens_per_step']:.2f} tokens/step; the next-token layer drafted "
                     f"{r['layer_drafted']}, accepted {r['layer_accepted']}, {r['layer_ms_per_token']:.1f} ms/token")
        log(f"{line} ({replies} reply tokens, identical)")
    result = {"workload": workload.name, "runs": runs, "max_tokens": budget, "identical": True,
              "reply_tokens": per_run[-1]["reply_tokens"], "per_run": per_run}
    for key in ("plain_tps", "spec_tps", "speedup", "tokens_per_step", "acceptance", *_LAYER_KEYS):
        if key in per_run[-1]:
            result[key] = summary([r[key] for r in per_run])
    return result


_LAYER_KEYS = ("cascade_tps", "cascade_tokens_per_step", "vs_cascade", "layer_ms_per_token")


def _layer_figures(cascade: _Side, spec: _Side, convo: Conversation) -> dict:
    """The speculative side beside the cascade alone, and what its next-token layer drafted and cost."""
    layer = next(s for s in convo.draft_sources() if s.name == "next-token layer")
    return {"cascade_tps": cascade.tps(), "cascade_tokens_per_step": cascade.stats.tokens_per_step(),
            "vs_cascade": spec.tps() / cascade.tps() if cascade.tps() else 0.0,
            "layer_ms_per_token": 1e3 * layer.seconds / max(spec.stats.committed, 1),
            "layer_drafted": layer.drafted, "layer_accepted": layer.accepted}


def spec_benchmark(model: Model, workloads: list[Workload], runs: int, *,
                   sampler: SamplerConfig = SamplerConfig(), max_tokens: int | None = None,
                   log: Callable[[str], None] = lambda s: None) -> dict:
    start = time.perf_counter()
    model.rows_ready(model.new_cache(1), wait=True)  # the verify kernels compiled (or loaded) first
    verify_cost_table(model)  # measured (or read back) before any timed reply; no timed reply waits for it
    costs_s = time.perf_counter() - start
    log(f"verify-cost table ready in {costs_s:.2f} s")
    return {"verify_costs_s": costs_s,
            "workloads": [run_workload(model, w, runs, sampler=sampler, max_tokens=max_tokens, log=log)
                          for w in workloads]}
