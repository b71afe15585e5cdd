"""`fucina warmup MODEL [--stage prefill|decode|verify]`: compile a starter model's kernels ahead of its first
reply (the app runs it in the background when a starter model first downloads or opens), printing a line
as each kernel starts compiling (the app shows them as the warm-up's progress)."""

from __future__ import annotations

from engine.platform import warmup


def run_warmup(args) -> int:
    for stage in [args.stage] if args.stage else warmup.STAGES + warmup.LATER_STAGES:
        warmup.warm(args.model, stage, lambda n, stage=stage: print(warmup.report_line(stage, n), flush=True))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("warmup", help="compile a starter model's kernels ahead of its first reply")
    p.add_argument("model", help="a starter model name (its file need not be downloaded yet)")
    p.add_argument("--stage", choices=warmup.STAGES + warmup.LATER_STAGES, default=None, help="one stage (default: all)")
    p.set_defaults(func=run_warmup)
