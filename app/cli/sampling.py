"""Sampler and reply-grammar flags shared by `fucina chat` and `fucina generate`."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

from engine.errors import FucinaError, InvalidGrammar
from engine.sampling import SamplerConfig
from engine.sampling.grammar import Grammar
from engine.sampling.json_schema import KEYWORDS


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


def add_grammar_options(p) -> None:
    """The flags that hold every reply to a grammar (at most one); TEXT|@FILE reads @FILE's contents."""
    group = p.add_argument_group("reply grammar (llguidance; at most one)", description=keyword_help())
    g = group.add_mutually_exclusive_group()
    g.add_argument("--json-schema", metavar="JSON|@FILE",
                   help="replies are JSON valid under this schema (keywords: see above); a reply that reaches "
                        "--max-tokens is closed as a whole document")
    g.add_argument("--json-object", action="store_true", help="replies are one JSON object")
    g.add_argument("--regex", metavar="PATTERN", help="replies match this regular expression")
    g.add_argument("--lark", metavar="GRAMMAR|@FILE", help="replies follow this Lark grammar (llguidance's variant)")
    g.add_argument("--gbnf", metavar="@FILE", help="replies follow this GBNF (llama.cpp) grammar")


def keyword_help() -> str:
    """How --json-schema handles each JSON Schema keyword, grouped by handling (docs/json-schema.md)."""
    by_handling: dict[str, list[str]] = {}
    for keyword, handling in KEYWORDS.items():
        by_handling.setdefault(handling, []).append(keyword)
    return "JSON Schema keywords: " + "; ".join(f"{', '.join(words)}: {handling}"
                                                 for handling, words in by_handling.items())


def grammar_from_args(args) -> Grammar | None:
    """The grammar the flags name, compiled now so a bad one fails before the model loads."""
    if args.json_object:
        return Grammar.json_object()
    for kind, flag in (("json_schema", "--json-schema"), ("regex", "--regex"), ("lark", "--lark"), ("gbnf", "--gbnf")):
        value = getattr(args, kind)
        if value is not None:
            try:  # a regex is always the pattern itself (one may start with "@")
                return Grammar(kind, value if kind == "regex" else _text_or_file(value, flag))
            except InvalidGrammar as e:
                raise InvalidGrammar(f"{flag}: {e}") from None
    return None


def _text_or_file(value: str, flag: str) -> str:
    if not value.startswith("@"):
        return value
    try:
        return Path(value[1:]).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise FucinaError(f"{flag}: cannot read {value[1:]}: {e}") from None


def print_reply_checks(finish_reason: str, warnings) -> None:
    """On stderr: a constrained reply closed to fit its limit, and each post-checked keyword it breaks."""
    if finish_reason == "length_closed":
        print("(closed at the length limit: the reply is a whole document, shortened to fit)", file=sys.stderr)
    for warning in warnings:
        print(f"warning: the reply breaks the schema at {warning}", file=sys.stderr)
