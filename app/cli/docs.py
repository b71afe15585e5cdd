"""`fucina docs add FILE… | list | remove ID`: the documents read into KV cartridges, which `--attach FILE`
(app.cli.attach) loads instead of reading the document again."""

from __future__ import annotations

import sys

from app.cli.attach import add_doc_budget_option, attach_documents, describe
from app.cli.common import add_compute_options, add_kv_option, open_model
from engine.cartridge import store
from engine.errors import FucinaError
from engine.serving.session import DEFAULT_CONTEXT


def run_add(args) -> int:
    model = open_model(args)
    # read for the chat a later --attach serves them to, by default
    for result in attach_documents(model, args.files, args.kv, DEFAULT_CONTEXT, budget=args.doc_budget):
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


def register(subparsers) -> None:
    docs = subparsers.add_parser("docs", help="documents read into KV cartridges for attaching to chats")
    sub = docs.add_subparsers(title="docs commands", metavar="COMMAND", required=True)
    p = sub.add_parser("add", help="read documents for a model (a later --attach loads them)")
    p.add_argument("files", metavar="FILE", nargs="+")
    # the model is an option here: the files are the positional arguments
    p.add_argument("--model", default=None, help="a starter model name or a .gguf path (default: the default model)")
    add_compute_options(p)
    add_kv_option(p)
    add_doc_budget_option(p)
    p.set_defaults(func=run_add)
    p = sub.add_parser("list", help="the stored documents, most recently used first")
    p.set_defaults(func=run_list)
    p = sub.add_parser("remove", help="delete a stored document's cartridge")
    p.add_argument("id", help="its id, or the start of it (see `fucina docs list`)")
    p.set_defaults(func=run_remove)
