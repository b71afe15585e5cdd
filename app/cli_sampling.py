"""Sampler flags shared by `fucina chat` and `fucina generate`."""

from __future__ import annotations

import secrets

from engine.sampling import SamplerConfig


def add_sampler_options(p, defaults: SamplerConfig = SamplerConfig()) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temp", type=float, default=defaults.temperature,
                   help=f"temperature; 0 is greedy (default {defaults.temperature:g})")
    g.add_argument("--top-k", type=int, default=defaults.top_k, help=f"0 disables (default {defaults.top_k})")
    g.add_argument("--top-p", type=float, default=defaults.top_p, help=f"nucleus mass (default {defaults.top_p:g})")
    g.add_argument("--min-p", type=float, default=defaults.min_p, help=f"0 disables (default {defaults.min_p:g})")
    g.add_argument("--repeat-penalty", type=float, default=defaults.repeat_penalty,
                   help=f"1 disables (default {defaults.repeat_penalty:g})")
    g.add_argument("--seed", type=int, default=None, help="sampling seed (default: a random one)")


def sampler_config(args) -> SamplerConfig:
    return SamplerConfig(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                         repeat_penalty=args.repeat_penalty,
                         seed=secrets.randbits(63) if args.seed is None else args.seed)
