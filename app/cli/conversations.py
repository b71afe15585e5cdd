"""`fucina conversations list | show | search | export | import | delete`: the stored chats.

A conversation is named by its id or any unique prefix of it (`list` shows the first 8 characters).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from engine.errors import HistoryError
from engine.history.store import HistoryStore
from engine.history.validate import read_export
from engine.serving.session import delete_conversation
from engine.platform.storage_errors import storage_error


def open_store() -> HistoryStore:
    return HistoryStore(HistoryStore.default_path())


def find_conversation(store: HistoryStore, prefix: str) -> str:
    """The id of the one conversation whose id starts with `prefix`."""
    ids = [c["id"] for c in store.list_conversations() if c["id"].startswith(prefix)]
    if len(ids) != 1:
        raise HistoryError(f"no conversation matches {prefix!r}" if not ids else
                           f"{prefix!r} matches {len(ids)} conversations; give more of the id")
    return ids[0]


def _list(store: HistoryStore, args) -> None:
    rows = store.list_conversations()
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return
    for c in rows:
        pin = "*" if c["pinned"] else " "
        print(f"{c['id'][:8]} {pin} {c['updated_at'][:16].replace('T', ' ')}  {c['title'] or '(untitled)'}"
              f"  [{Path(c['model']).name}]")


def _show(store: HistoryStore, args) -> None:
    cid = find_conversation(store, args.id)
    if args.json:
        json.dump(store.active_branch(cid), sys.stdout, indent=1)
        print()
    else:
        print(store.export_markdown(cid))


def _search(store: HistoryStore, args) -> None:
    hits = store.search(" ".join(args.query))
    if args.json:
        json.dump(hits, sys.stdout, indent=1)
        print()
        return
    if not hits:
        print(f"no message contains every word of: {' '.join(args.query)}")
        return
    titles = {c["id"]: c["title"] for c in store.list_conversations()}
    for h in hits:
        print(f"{h['conversation_id'][:8]}  {titles.get(h['conversation_id']) or '(untitled)'}: "
              f"{' '.join(h['snippet'].split())}")


def _export(store: HistoryStore, args) -> None:
    cid = find_conversation(store, args.id)
    text = (json.dumps(store.export_json(cid), indent=1, ensure_ascii=False) + "\n" if args.format == "json"
            else store.export_markdown(cid))
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as e:  # a full disk, a read-only or missing folder
            raise storage_error(e, args.output) from None
    else:
        sys.stdout.write(text)


def _import(store: HistoryStore, args) -> None:
    print(store.import_json(read_export(args.file)))


def _delete(store: HistoryStore, args) -> None:
    cid = find_conversation(store, args.id)
    delete_conversation(store, cid)
    print(f"deleted {cid}", file=sys.stderr)


def run(args) -> int:
    with open_store() as store:
        args.action(store, args)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("conversations", help="list, show, search, export, import or delete stored chats")
    sub = p.add_subparsers(title="actions", metavar="ACTION", required=True)

    def action(name: str, handler, help: str, json_flag: bool = True):
        a = sub.add_parser(name, help=help)
        if json_flag:
            a.add_argument("--json", action="store_true", help="machine-readable output")
        a.set_defaults(func=run, action=handler)
        return a

    action("list", _list, "stored conversations, pinned first, newest first")
    action("show", _show, "a conversation's active branch").add_argument("id")
    action("search", _search, "messages containing every word").add_argument("query", nargs="+")
    e = action("export", _export, "a conversation as Markdown or JSON", json_flag=False)
    e.add_argument("id")
    e.add_argument("--format", choices=["md", "json"], default="md")
    e.add_argument("-o", "--output", help="write to this file (default: standard output)")
    action("import", _import, "a conversation exported as JSON; prints its new id",
           json_flag=False).add_argument("file")
    action("delete", _delete, "a conversation and its KV sidecar", json_flag=False).add_argument("id")
