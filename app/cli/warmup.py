"""`fucina warmup MODEL [--stage prefill|decode|verify]`: compile a starter model's kernels ahead of its first
reply (the app runs it in the background on the first start, while the model downloads)."""

from __future__ import annotations

from engine.platform import warmup


def run_warmup(args) -> int:
    for stage in [args.stage] if args.stage else warmup.STAGES + warmup.LATER_STAGES:
        warmup.warm(args.model, stage)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("warmup", help="compile a starter model's kernels ahead of its first reply")
    p.add_argument("model", help="a starter model name (its file need not be downloaded yet)")
    p.add_argument("--stage", choices=warmup.STAGES + warmup.LATER_STAGES, default=None, help="one stage (default: all)")
    p.set_defaults(func=run_warmup)
