"""`fucina experts replay TRACE`: an experts trace (recorded with --moe-trace) through the cache policies over
a range of capacities: whether more cache or a better policy would help; with --pins-from, whether the pins
learned on other runs keep what the trace's own would."""

from __future__ import annotations

import json
import sys

from engine.errors import FucinaError
from engine.models.expert_replay import POLICIES, hit_rate, replay, sweep
from engine.models.expert_store import Trace, load_usage


def register(subparsers) -> None:
    p = subparsers.add_parser("experts", help="streamed experts: replay a trace through the cache policies")
    sub = p.add_subparsers(dest="experts_command", required=True)
    r = sub.add_parser("replay", help="hit rates of each cache policy over a range of slots per layer")
    r.add_argument("trace", help="a trace saved by --moe-trace")
    r.add_argument("--slots", metavar="N,N,...", default=None,
                   help="experts held per layer (default: 1, 2, 4, ... up to the experts a layer has)")
    r.add_argument("--pins-from", metavar="USAGE", default=None,
                   help="pin by an experts usage file (MODEL.gguf.experts, learned on other runs) rather than by the "
                        "trace's own most routed experts")
    r.add_argument("--json", action="store_true", help="machine-readable output")
    r.set_defaults(func=_replay)


def _replay(args) -> int:
    trace = Trace.load(args.trace)
    if not trace.layers:
        raise FucinaError(f"{args.trace}: the trace has no layers")
    n_expert = max(n for n, _ in trace.layers.values())
    try:
        slots = ([int(n) for n in args.slots.split(",")] if args.slots
                 else [1 << i for i in range(n_expert.bit_length()) if 1 << i < n_expert] + [n_expert])
    except ValueError:
        raise FucinaError(f"--slots takes comma-separated counts, got {args.slots!r}") from None
    if min(slots) < 1:
        raise FucinaError("--slots needs counts of at least 1")
    usage = None
    if args.pins_from:
        usage = load_usage(args.pins_from)
        if not usage:
            raise FucinaError(f"{args.pins_from}: not an experts usage file (or it holds nothing)")
    rates = sweep(trace, slots, usage=usage)
    as_run = {policy: hit_rate(*replay(trace, policy, usage=usage)) for policy in POLICIES}  # the slots as recorded
    if args.json:
        json.dump({"slots": slots, "hit_rate": rates, "as_run": as_run, "calls": len(trace.calls),
                   "pins_from": args.pins_from}, sys.stdout, indent=1)
        print()
        return 0
    print(f"{args.trace}: {len(trace.calls)} calls over {len(trace.layers)} layers; hit rate by slots per layer "
          f"(as run: each layer's slots when it was recorded); pinned by "
          + (f"the usage in {args.pins_from}" if args.pins_from else "the trace's own most routed experts"))
    print(f"{'slots':>12}{'as run':>8}" + "".join(f"{n:>8}" for n in slots))
    for policy in POLICIES:
        print(f"{policy:>12}{as_run[policy]:>8.1%}" + "".join(f"{r:>8.1%}" for r in rates[policy]))
    return 0
