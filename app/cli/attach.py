"""Documents served to a command's chat: the `--attach FILE` option of `chat` and `generate`, which `docs add`
reads ahead of them.

A document is read once per model and cache type into a KV cartridge (engine.cartridge) kept under the
data dir; attaching it again loads the cartridge's rows instead of reading the document again.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from app.cli.progress import ProgressBar, tokens
from engine.cartridge.build import Attached
from engine.cartridge.chat_documents import Restored, restore
from engine.cartridge.fleet import FleetDocument
from engine.cartridge.for_chat import check_document_count, read_for_chat
from engine.cartridge.ingest import read_document
from engine.chat import template_for_model
from engine.model_tokenizer import tokenizer_for
from engine.serving.session import DEFAULT_CONTEXT


def add_attach_option(p) -> None:
    p.add_argument("--attach", metavar="FILE", action="append", default=[],
                   help="serve the chat behind this document (text, Markdown, code, HTML, PDF, DOCX); repeat for "
                        "several. Read once per model, then loaded (with generate: needs --chat)")
    add_doc_budget_option(p)


def add_doc_budget_option(p) -> None:
    p.add_argument("--doc-budget", metavar="TOKENS", type=positive_int, default=None,
                   help=f"tokens one attached document may take (default: half the chat's context, which is "
                        f"{DEFAULT_CONTEXT} unless chat --ctx sets it). A longer one is read in parts, and the parts "
                        "that best match the question are served (in a chat: the first message)")


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of tokens, not {text!r}")
    return int(text)


def attach_documents(model, paths, kv: str, context: int, *, budget: int | None = None,
                     question: Callable[[], str] | None = None) -> list[Attached]:
    """Each file's cartridge for a chat of `context` tokens on the model: loaded when built before, else read
    with a progress bar. A file longer than `budget` tokens (default: the share of the chat's context one
    document may take, engine.cartridge.for_chat) is served as a fleet (engine.cartridge.fleet): the
    cartridges of its parts that best match the question `question()` gives (asked for only then; without
    one, the parts are read and none is attached)."""
    if not paths:
        return []
    check_document_count(model, len(paths))
    tokenizer = tokenizer_for(model)
    template = template_for_model(model.file.metadata, tokenizer)
    attached = []
    for path in paths:
        document = read_document(path)
        with ProgressBar(amounts=tokens) as bar:
            served = read_for_chat(model, tokenizer, template, document, context, kv, budget=budget,
                                   on_progress=lambda done, total: bar(done, total, f"reading {document.name}"))
        results = _served_parts(served, question) if isinstance(served, FleetDocument) else [served]
        for result in results:
            if result.refused:
                print(f"warning: {result.refused}; it was built again", file=sys.stderr)
        attached += results
    return attached


def _served_parts(fleet: FleetDocument, question: Callable[[], str] | None) -> list[Attached]:
    """The parts of a long document that match the question, asked for now."""
    print(f"({fleet.document.name} is longer than the {fleet.budget} tokens one document may take: read in "
          f"{len(fleet.chunks)} parts{'; the parts that match the question are served' * bool(question)})",
          file=sys.stderr)
    asked = question() if question is not None else ""
    return fleet.select(asked) if asked.strip() else []


def restore_documents(history, conversation_id: str, model) -> list[Restored]:
    """A stored chat's documents: loaded, or (a cartridge evicted or damaged) read again with a progress bar
    each."""
    tokenizer = tokenizer_for(model)
    names = {r["id"]: r["name"] for r in history.attachments(conversation_id)}
    bars: list[ProgressBar] = []  # the bar of the document being read now

    def progress(attachment_id: str, done: int, total: int) -> None:
        stage = f"reading {names[attachment_id]}"
        if bars and bars[0].stage != stage:
            bars.pop().close()
        if not bars:
            bars.append(ProgressBar(amounts=tokens))
        bars[0](done, total, stage)

    try:
        return restore(history, conversation_id, model, tokenizer, template_for_model(model.file.metadata, tokenizer),
                       on_progress=progress)
    finally:
        if bars:
            bars[0].close()


def describe(result: Attached) -> str:
    c = result.cartridge
    how = ("read" if result.built else "loaded") + (" (chosen for the question)" if result.chunk is not None else "")
    return (f"{c.name}: {c.rows} tokens, {how} in {result.seconds:.2f} s "
            f"({c.byte_size() / c.rows / 1024:.1f} KiB per token) [{c.id}]")
