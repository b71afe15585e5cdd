"""`fucina chat [MODEL]`: a terminal chat that streams replies.

Interactive on a terminal; from a pipe it answers one message per input line until EOF. Replies (and
/stats) go to stdout, notices to stderr, so a piped run's stdout holds only the conversation's answers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterator

from app.cli_eval import add_model_options, open_model
from app.cli_sampling import add_sampler_options, sampler_config
from engine.chat import ChatOptions, Conversation, TurnResult
from engine.errors import ContextFull, FucinaError
from engine.sampling import CHAT_DEFAULTS

HELP = """commands:
  /reset        forget the conversation
  /system TEXT  set the system prompt (empty to clear) and start over
  /stats        numbers for the last reply
  /quit         leave (so does end of input)"""


def run_chat(args) -> int:
    model = open_model(args)
    convo = Conversation.for_model(model, ChatOptions(
        system=args.system, capacity=args.ctx, kv_dtype=args.kv, max_tokens=args.max_tokens,
        think_off=args.no_think, sampler=sampler_config(args)))
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"fucina chat · {Path(model.file.path).name} · /help for commands", file=sys.stderr)
    for line in _lines(interactive):
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            if not _command(convo, text):
                break
            continue
        _reply(convo, text)
    return 0


def _lines(interactive: bool) -> Iterator[str]:
    if not interactive:
        yield from sys.stdin
        return
    while True:
        try:
            yield input("> ")
        except EOFError:
            print(file=sys.stderr)
            return


def _reply(convo: Conversation, text: str) -> None:
    try:
        for piece in convo.send(text):
            print(piece, end="", flush=True)
    except KeyboardInterrupt:  # Ctrl-C stops this reply, not the chat
        print(" [stopped]", end="")
    except ContextFull as e:
        print(f"error: {e} (/reset starts over)", file=sys.stderr)
        return
    except FucinaError as e:
        print(f"error: {e}", file=sys.stderr)
        return
    print(flush=True)


def _command(convo: Conversation, text: str) -> bool:
    """Run a slash command; False means leave."""
    name, _, rest = text.partition(" ")
    if name == "/quit":
        return False
    if name == "/reset":
        convo.reset()
        print("(conversation reset)", file=sys.stderr)
    elif name == "/system":
        convo.system = rest.strip() or None
        convo.reset()
        print("(system prompt set; conversation reset)" if convo.system else "(system prompt cleared)",
              file=sys.stderr)
    elif name == "/stats":
        print(format_stats(convo.last_turn) if convo.last_turn else "no reply yet", flush=True)
    elif name == "/help":
        print(HELP, file=sys.stderr)
    else:
        print(f"unknown command {name}; /help lists them", file=sys.stderr)
    return True


def format_stats(turn: TurnResult) -> str:
    s = turn.stats
    return (f"prompt {s.prompt_tokens} tokens ({s.reused_tokens} reused, {s.prefilled_tokens} prefilled in "
            f"{s.prefill_ms:.0f} ms) · first token {s.ttft_ms:.0f} ms · {s.generated_tokens} tokens at "
            f"{s.decode_tps:.1f} tok/s · ended: {turn.finish_reason}")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def register(subparsers) -> None:
    p = subparsers.add_parser("chat", help="chat with a model in the terminal (or answer lines from a pipe)")
    add_model_options(p, optional=True)
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--max-tokens", type=positive_int, default=512, help="longest reply in tokens (default 512)")
    p.add_argument("--ctx", type=positive_int, default=4096, help="context size in tokens (default 4096)")
    p.add_argument("--no-think", action="store_true", help="render with the reasoning channel closed")
    add_sampler_options(p, CHAT_DEFAULTS)
    p.set_defaults(func=run_chat)
