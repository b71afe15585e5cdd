"""`fucina docs add FILE… | list | remove ID`, and the `--attach FILE` option of `chat` and `generate`.

A document is read once per model and cache type into a KV cartridge (engine.cartridge) kept under the
data dir; attaching it again loads the cartridge's rows instead of reading the document again.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

from app.cli.backend import add_backend_option
from engine.cartridge import store
from engine.cartridge.build import Attached, attach, prefix_ids
from engine.cartridge.chat_documents import Restored, restore
from engine.cartridge.fleet import FleetDocument
from engine.cartridge.ingest import read_document
from engine.chat import template_for_model
from engine.errors import FucinaError
from engine.session import tokenizer_for
from engine.tokenize import load_tokenizer


class TokenProgress:
    """A one-line progress bar for reading a document (prefilled tokens) on stderr; one line when not a
    terminal."""

    def __init__(self, name: str, stream=None, width: int = 24):
        self.name, self.stream, self.width = name, stream or sys.stderr, width
        self.tty = self.stream.isatty()
        self.start = time.monotonic()
        self.drawn = False

    def __call__(self, done: int, total: int) -> None:
        if not self.tty:
            if not self.drawn:
                self.stream.write(f"reading {self.name} ({total} tokens)\n")
                self.drawn = True
            return
        frac = done / total if total else 1.0
        rate = done / max(time.monotonic() - self.start, 1e-6)
        self.stream.write(f"\r[{'#' * int(frac * self.width)}{'.' * (self.width - int(frac * self.width))}] "
                          f"{frac * 100:5.1f}% {done}/{total} tokens {rate:6.1f} tok/s  reading {self.name}\x1b[K")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.drawn = False


def attach_documents(model, paths, kv: str, *, budget: int | None = None,
                     question: Callable[[], str] | None = None) -> list[Attached]:
    """Each file's cartridge for the model: loaded when built before, else read with a progress bar. A file
    longer than `budget` tokens (default: half the model's context) is served as a fleet
    (engine.cartridge.fleet): the cartridges of its parts that best match the question `question()` gives
    (asked for only then; without one, the parts are read and none is attached)."""
    if not paths:
        return []
    budget = budget or model.args.context_length // 2
    tokenizer = load_tokenizer(model.file.metadata)
    template = template_for_model(model.file.metadata, tokenizer)
    attached = []
    for path in paths:
        document = read_document(path)
        progress = TokenProgress(document.name)
        try:
            if len(prefix_ids(tokenizer, template, document)) <= budget:
                results = [attach(model, tokenizer, template, document, kv, on_progress=progress)]
            else:
                fleet = FleetDocument.open(model, tokenizer, template, document, budget, kv, on_progress=progress)
                progress.close()
                print(f"({document.name} is longer than the {budget} tokens one document may take: read in "
                      f"{len(fleet.chunks)} parts{'; the parts that match the question are served' * bool(question)})",
                      file=sys.stderr)
                asked = question() if question is not None else ""
                results = fleet.select(asked) if asked.strip() else []
        finally:
            progress.close()
        for result in results:
            if result.refused:
                print(f"warning: {result.refused}; it was built again", file=sys.stderr)
        attached += results
    return attached


def restore_documents(history, conversation_id: str, model) -> list[Restored]:
    """A stored chat's documents: loaded, or (a cartridge evicted or damaged) read again with a progress bar."""
    tokenizer = tokenizer_for(model)
    names = {r["id"]: r["name"] for r in history.attachments(conversation_id)}
    bar: list[TokenProgress] = []  # the document being read now

    def progress(attachment_id: str, done: int, total: int) -> None:
        if not bar or bar[0].name != names[attachment_id]:
            if bar:
                bar.pop().close()
            bar.append(TokenProgress(names[attachment_id]))
        bar[0](done, total)

    try:
        return restore(history, conversation_id, model, tokenizer, template_for_model(model.file.metadata, tokenizer),
                       on_progress=progress)
    finally:
        if bar:
            bar[0].close()


def describe(result: Attached) -> str:
    c = result.cartridge
    how = ("read" if result.built else "loaded") + (" (chosen for the question)" if result.chunk is not None else "")
    return (f"{c.name}: {c.rows} tokens, {how} in {result.seconds:.2f} s "
            f"({c.byte_size() / c.rows / 1024:.1f} KiB per token) [{c.id}]")


def run_add(args) -> int:
    from app.cli.generate import open_model  # not at the top: cli_eval imports this module

    model = open_model(args)
    for result in attach_documents(model, args.files, args.kv, budget=args.doc_budget):
        print(describe(result))
    return 0


def run_list(args) -> int:
    rows = store.stored()
    if not rows:
        print("no documents read yet (fucina docs add FILE)", file=sys.stderr)
        return 0
    for c in rows:
        print(f"{c.id}  {c.rows:7d} tokens  {c.bytes / 1e6:8.1f} MB  {c.kv_dtype:5s}  {c.name}")
    return 0


def run_remove(args) -> int:
    matches = [c for c in store.stored() if c.id.startswith(args.id)]
    if not matches:
        raise FucinaError(f"no stored document's id starts with {args.id!r} (see `fucina docs list`)")
    if len(matches) > 1:
        raise FucinaError(f"{len(matches)} stored documents' ids start with {args.id!r}; give more of the id")
    store.delete(matches[0])
    print(f"removed {matches[0].name} [{matches[0].id}]", file=sys.stderr)
    return 0


def add_attach_option(p) -> None:
    p.add_argument("--attach", metavar="FILE", action="append", default=[],
                   help="serve the chat behind this document (text, Markdown, code, HTML, PDF, DOCX); repeat for "
                        "several. Read once per model, then loaded (with generate: needs --chat)")
    add_doc_budget_option(p)


def add_doc_budget_option(p) -> None:
    p.add_argument("--doc-budget", metavar="TOKENS", type=positive_int, default=None,
                   help="tokens one attached document may take (default: half the context). A longer one is "
                        "read in parts, and the parts that best match the question are served (in a chat: the "
                        "first message)")


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of tokens, not {text!r}")
    return int(text)


def register(subparsers) -> None:
    docs = subparsers.add_parser("docs", help="documents read into KV cartridges for attaching to chats")
    sub = docs.add_subparsers(title="docs commands", metavar="COMMAND", required=True)
    p = sub.add_parser("add", help="read documents for a model (a later --attach loads them)")
    p.add_argument("files", metavar="FILE", nargs="+")
    # the model is an option here: the files are the positional arguments
    p.add_argument("--model", default=None, help="a starter model name or a .gguf path (default: the default model)")
    p.add_argument("--threads", type=int, default=None, help="kernel threads (default: $FUCINA_THREADS or all cores)")
    add_backend_option(p)
    p.add_argument("--kv", choices=["f16", "q8_0"], default="f16", help="KV cache type")
    add_doc_budget_option(p)
    p.set_defaults(func=run_add)
    p = sub.add_parser("list", help="the stored documents, most recently used first")
    p.set_defaults(func=run_list)
    p = sub.add_parser("remove", help="delete a stored document's cartridge")
    p.add_argument("id", help="its id, or the start of it (see `fucina docs list`)")
    p.set_defaults(func=run_remove)
