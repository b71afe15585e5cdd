"""The `fucina` command line: a thin argparse dispatcher over per-topic command modules (this package)."""

from __future__ import annotations

import argparse
import multiprocessing
import sys

from app.cli import bench, chat, conversations, desktop, docs, experts, generate, models, serve, tokenize, warmup
from app.cli.common import report_streams
from app.gui import THEMES
from engine.errors import FucinaError

# Each module's `register(subparsers)` adds its subcommands and sets `func(args) -> int | None` on them.
# A new command family is one new module and one entry here.
COMMANDS = [
    models.register,
    tokenize.register,
    generate.register,
    bench.register,
    experts.register,
    chat.register,
    conversations.register,
    docs.register,
    serve.register,
    warmup.register,
    desktop.register,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fucina", description="Chat with local language models. "
                                     "With no command, opens the desktop app.")
    parser.add_argument("--screenshot", metavar="PATH", help="render the app's window to a PNG and exit")
    parser.add_argument("--theme", choices=THEMES, help="the app's theme for this run (default: the one chosen "
                        "in the app)")
    parser.add_argument("--conversation", metavar="ID", dest="gui_conversation",  # `chat --conversation` differs
                        help="the conversation the app opens (default: the last one)")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for register in COMMANDS:
        register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; the return value is the process exit status."""
    multiprocessing.freeze_support()  # in a frozen app, a child process (the chat-template renderer) runs here
    args = build_parser().parse_args(argv)
    try:
        if not hasattr(args, "func"):
            from app.gui.app import run  # Qt loads only for the desktop app
            return run(args.screenshot, args.gui_conversation, args.theme)
        try:
            return args.func(args) or 0
        finally:
            report_streams()
    except FucinaError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ncancelled", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`; stop quietly like other tools
        sys.stdout = None
        return 1
