"""A document read for a chat of a given context: whole, as one cartridge, when it fits the share of the
context one document may take; else as a fleet of parts (engine.cartridge.fleet), of which the chat's
first message chooses the ones served. The command line and the app both read documents through here, so
a document read by one is served the same way by the other.
"""

from __future__ import annotations

import os
import threading

from engine.cartridge.build import DEFAULT_DISK_BUDGET, Attached, OnProgress, attach, prefix_ids
from engine.cartridge.cartridge import not_composable
from engine.cartridge.fleet import PER_ANSWER, FleetDocument
from engine.cartridge.ingest import Document
from engine.kv.cache import KvDtype
from engine.models.model import Model
from engine.tokenize import Tokenizer


def document_budget(context: int) -> int:
    """The prefix rows one document may take in a chat of `context` tokens: half; the other half is the
    conversation's."""
    return context // 2


def read_for_chat(model: Model, tokenizer: Tokenizer, template, document: Document, context: int,
                  dtype: KvDtype | str = KvDtype.F16, *, budget: int | None = None,
                  directory: str | os.PathLike | None = None, on_progress: OnProgress | None = None,
                  cancel: threading.Event | None = None,
                  disk_budget: int = DEFAULT_DISK_BUDGET) -> Attached | FleetDocument:
    """The document for a chat of `context` tokens: its cartridge (loaded, or built and stored) when its
    prefix fits `budget` rows (default: document_budget(context)), else its fleet, opened (every part read,
    none chosen yet; one part served per answer where documents do not compose)."""
    budget = budget or document_budget(context)
    if len(prefix_ids(tokenizer, template, document)) <= budget:
        return attach(model, tokenizer, template, document, dtype, directory=directory, on_progress=on_progress,
                      cancel=cancel, disk_budget=disk_budget)
    return FleetDocument.open(model, tokenizer, template, document, budget, dtype,
                              per_answer=PER_ANSWER if documents_compose(model) else 1, directory=directory,
                              on_progress=on_progress, cancel=cancel, disk_budget=disk_budget)


def check_document_count(model: Model, count: int) -> None:
    """Refuse, before any of them is read, more documents than the model can serve a chat behind at once
    (InvalidPrefix)."""
    if count > 1 and not documents_compose(model):
        raise not_composable(count)


def documents_compose(model: Model) -> bool:
    """Whether several documents' cartridges can be served together on this model: not where its memory keeps a
    recurrent state (a hybrid's: engine.kv.memory's `composable`), whose cartridge is a snapshot of one whole
    prefix; there a fleet serves one part per answer."""
    return not model.args.state_shapes()
