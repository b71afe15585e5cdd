"""The documents attached to a stored conversation: recorded with it in the history store, and served
again when it reopens.

A conversation's attachment rows name each document by the SHA-256 of its text, which (with the model and
the cache type) names its cartridge: reopening loads the same rows without reading the file, so the
composition, and with it the sidecar behind it, is the one the chat was saved behind (warm and exact).
A cartridge that was evicted, deleted or damaged is built again from the file it was read from; a file
that changed since is read as it is now (the chat's prefix changes: its history is read again). A
document whose cartridge is gone and whose file cannot be read is left out, and says why; the chat opens
without it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Callable

from engine.cartridge.build import DEFAULT_DISK_BUDGET, Attached, attach, load_stored
from engine.cartridge.cartridge import Cartridge
from engine.cartridge.ingest import read_document
from engine.errors import CartridgeCancelled, FucinaError
from engine.history.store import HistoryStore
from engine.kv.cache import KvDtype
from engine.models.model import Model
from engine.tokenize import Tokenizer

OnRowProgress = Callable[[str, int, int], None]  # (attachment id, tokens prefilled, tokens to prefill)


@dataclass
class Restored:
    """One attachment of a reopened conversation."""
    row: dict  # the store's attachment row
    cartridge: Cartridge | None  # None: left out (`note` says why)
    note: str | None = None  # what the user should hear: read again, changed, left out


def record(store: HistoryStore, conversation_id: str, source: str | os.PathLike, attached: Attached) -> str:
    """Store that the conversation is served behind `attached`, read from the file `source`; the row's id."""
    kind = attached.document.kind if attached.document else "cartridge"  # a cartridge file attached as it is
    return store.add_attachment(conversation_id, attached.cartridge.name, kind, os.path.abspath(source),
                                attached.cartridge.document, attached.cartridge.rows)


def carry_over(store: HistoryStore, from_id: str, to_id: str, served: list[Cartridge]) -> None:
    """Record on conversation `to_id` the documents of `from_id` that are `served` (a chat that starts over
    keeps its documents; one left out stays out)."""
    documents = {c.document for c in served}
    for row in store.attachments(from_id):
        if row["document"] in documents:
            store.add_attachment(to_id, row["name"], row["kind"], row["path"], row["document"], row["tokens"])


def restore(store: HistoryStore, conversation_id: str, model: Model, tokenizer: Tokenizer, template,
            dtype: KvDtype | str = KvDtype.F16, *, directory: str | os.PathLike | None = None,
            on_progress: OnRowProgress | None = None, cancel: threading.Event | None = None,
            disk_budget: int = DEFAULT_DISK_BUDGET) -> list[Restored]:
    """Each recorded attachment's cartridge, in the order they were attached. `cancel` set stops the
    documents being read again: they are left out of this opening."""
    return [_restore(store, row, model, tokenizer, template, dtype, directory, on_progress, cancel, disk_budget)
            for row in store.attachments(conversation_id)]


def cartridges(restored: list[Restored]) -> list[Cartridge]:
    return [r.cartridge for r in restored if r.cartridge is not None]


def _restore(store, row, model, tokenizer, template, dtype, directory, on_progress, cancel, disk_budget) -> Restored:
    refused = None
    if row["document"]:
        cart, refused = load_stored(model, row["document"], dtype, directory=directory)
        if cart is not None:
            return Restored(row, cart)
    try:
        document = read_document(row["path"])
        progress = None if on_progress is None else (lambda done, total: on_progress(row["id"], done, total))
        result = attach(model, tokenizer, template, document, dtype, directory=directory, on_progress=progress,
                        cancel=cancel, disk_budget=disk_budget)
    except CartridgeCancelled:
        return Restored(row, None, f"{row['name']} was left out: reading it again was cancelled (reopen the chat "
                                   "to read it)")
    except FucinaError as e:  # unreadable, too long for this model's context, a disk that refuses the file
        gone = "is damaged" if refused else "is not stored for this model"
        return Restored(row, None, f"{row['name']} was left out: its cartridge {gone} and it cannot be read "
                                   f"again ({e}); attach it to a new chat to use it")
    if row["document"] and document.sha256 != row["document"]:
        note = f"{row['name']} changed since it was attached: read again as it is now"
    elif result.built:
        note = f"{row['name']} was read again ({refused or 'its cartridge was not stored for this model'})"
    else:
        note = None
    if document.sha256 != row["document"] or result.cartridge.rows != row["tokens"]:
        store.update_attachment(row["id"], document=document.sha256, tokens=result.cartridge.rows)
    return Restored(row, result.cartridge, note)
