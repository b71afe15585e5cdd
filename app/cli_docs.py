"""`fucina docs add FILE… | list | remove ID`, and the `--attach FILE` option of `chat` and `generate`.

A document is read once per model and cache type into a KV cartridge (engine.cartridge) kept under the
data dir; attaching it again loads the cartridge's rows instead of reading the document again.
"""

from __future__ import annotations

import sys
import time

from app.cli_backend import add_backend_option
from engine.cartridge import store
from engine.cartridge.build import Attached, attach
from engine.cartridge.ingest import read_document
from engine.chat import template_for_model
from engine.errors import FucinaError
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


def attach_documents(model, paths, kv: str) -> list[Attached]:
    """Each file's cartridge for the model: loaded when built before, else read with a progress bar."""
    if not paths:
        return []
    tokenizer = load_tokenizer(model.file.metadata)
    template = template_for_model(model.file.metadata, tokenizer)
    attached = []
    for path in paths:
        document = read_document(path)
        progress = TokenProgress(document.name)
        try:
            result = attach(model, tokenizer, template, document, kv, on_progress=progress)
        finally:
            progress.close()
        if result.refused:
            print(f"warning: {result.refused}; it was built again", file=sys.stderr)
        attached.append(result)
    return attached


def describe(result: Attached) -> str:
    c = result.cartridge
    how = "read" if result.built else "loaded"
    return (f"{c.name}: {c.rows} tokens, {how} in {result.seconds:.2f} s "
            f"({c.byte_size() / c.rows / 1024:.1f} KiB per token) [{c.id}]")


def run_add(args) -> int:
    from app.cli_eval import open_model  # not at the top: cli_eval imports this module

    model = open_model(args)
    for result in attach_documents(model, args.files, args.kv):
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
    try:
        matches[0].path.unlink()
    except OSError as e:
        raise FucinaError(f"cannot remove {matches[0].path}: {e.strerror or e}") from None
    print(f"removed {matches[0].name} [{matches[0].id}]", file=sys.stderr)
    return 0


def add_attach_option(p) -> None:
    p.add_argument("--attach", metavar="FILE", action="append", default=[],
                   help="serve the chat behind this document (text, Markdown, code, HTML, PDF, DOCX); repeat for "
                        "several. Read once per model, then loaded (with generate: needs --chat)")


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
    p.set_defaults(func=run_add)
    p = sub.add_parser("list", help="the stored documents, most recently used first")
    p.set_defaults(func=run_list)
    p = sub.add_parser("remove", help="delete a stored document's cartridge")
    p.add_argument("id", help="its id, or the start of it (see `fucina docs list`)")
    p.set_defaults(func=run_remove)
