"""`fucina models list | pull NAME | path NAME | info NAME`: the starter-model catalog on the command line, and
what a model file holds and needs."""

from __future__ import annotations

import dataclasses
import json
import sys

from app.cli.progress import ProgressBar
from engine.gguf.reader import open_gguf
from engine.models import footprint, has_next_token_layer, kv_bytes_per_token
from engine.platform import catalog


def register(subparsers) -> None:
    models = subparsers.add_parser("models", help="list and download the starter models")
    actions = models.add_subparsers(title="actions", metavar="ACTION", required=True)

    ls = actions.add_parser("list", help="show the starter models and whether they are downloaded")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=_list)

    pull = actions.add_parser("pull", help="download a starter model (an interrupted pull resumes)")
    pull.add_argument("name", help="starter model name, see `fucina models list`")
    pull.add_argument("--verify", action="store_true", help="re-hash a model that is already downloaded")
    pull.set_defaults(func=_pull)

    path = actions.add_parser("path", help="print a model's file path, downloading it first if needed")
    path.add_argument("name", help="starter model name or path to a .gguf file")
    path.set_defaults(func=_path)

    info = actions.add_parser("info", help="a model's family, parameters, size and KV cache per token, and whether "
                                           "it fits this machine")
    info.add_argument("name", help="starter model name or path to a .gguf file")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(func=_info)


def _list(args) -> None:
    default = catalog.default_model_name()
    rows = [
        {
            "name": m.name,
            "display_name": m.display_name,
            "description": m.description,
            "size": m.size,
            "downloaded": m.is_downloaded(),
            "default": m.name == default,
            "path": str(m.path()),
        }
        for m in catalog.catalog().values()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    width = max(len(r["name"]) for r in rows) + 2  # room for the default marker
    for r in rows:
        name = r["name"] + (" *" if r["default"] else "")
        status = "downloaded" if r["downloaded"] else "-"
        print(f"{name:<{width}}  {r['size'] / 1e6:6.0f} MB  {status:<10}  {r['description']}")
    print(f"\n* default model; files live in {catalog.models_dir()}")


def _pull(args) -> None:
    model = catalog.catalog().get(args.name)
    if model is not None and model.is_downloaded() and not args.verify:
        print(f"{model.name} is already downloaded: {model.path()}", file=sys.stderr)
        return
    with ProgressBar() as bar:
        path = catalog.pull(args.name, progress=bar, verify=args.verify)
    print(path)


def _path(args) -> None:
    with ProgressBar() as bar:
        print(catalog.resolve_model(args.name, pull_missing=True, progress=bar).absolute())


def _info(args) -> None:
    with open_gguf(catalog.resolve_model(args.name)) as file:
        fp, kv, drafts = footprint.footprint(file), kv_bytes_per_token(file), has_next_token_layer(file)
    if args.json:
        print(json.dumps(dataclasses.asdict(fp) | {"needed_bytes": fp.needed_bytes,
                                                   "machine_memory": footprint.machine_memory(),
                                                   "fits": footprint.fits(fp), "kv_bytes_per_token": kv,
                                                   "next_token_layer": drafts}, indent=2))
        return
    print(footprint.describe(fp))
    if kv is not None:  # what makes one model hold a longer chat than another in the same memory
        print(f"KV cache: {kv / 1024:.1f} KB per token of context (f16), {kv * 4096 / 1e6:.0f} MB for 4,096 tokens")
    if drafts:
        print("next-token prediction (MTP) layer: speculative replies draft from it")
    if verdict := footprint.memory_verdict(fp):
        print(verdict)
