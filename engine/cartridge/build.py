"""Turning a document into a cartridge, and attaching one: load it when it was built before, else build it.

The document is wrapped the way the model's chat template presents reference material (render_reference:
a system block in ChatML and Llama 3, an acknowledged user turn in Gemma) and prefilled into an empty
cache, in the same UBATCH slices a conversation's prefill uses. The prefix starts the sequence, so it gets
the tokenizer's BOS; the chat's tokens after it never do.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

from engine.cartridge import store
from engine.cartridge.cartridge import Cartridge, cartridge_id
from engine.cartridge.ingest import Document
from engine.errors import CartridgeCancelled, CartridgeRefused, DocumentTooLong
from engine.kv.cache import KvDtype
from engine.kv.persist import model_fingerprint
from engine.models.model import UBATCH, Model
from engine.tokenize import Tokenizer

OnProgress = Callable[[int, int], None]  # (tokens prefilled, tokens to prefill)

# What the cartridges folder may hold by default: Qwen2.5-0.5B's rows take 12 KiB a token, so about 170
# documents of 2,000 tokens.
DEFAULT_DISK_BUDGET = 4 << 30

REFERENCE = "The user attached the following document. Use it to answer their questions.\n\n{text}"


def prefix_ids(tokenizer: Tokenizer, template, document: Document) -> list[int]:
    """The token ids a document's cartridge is prefilled from."""
    return tokenizer.encode(template.render_reference(REFERENCE.format(text=document.text.strip())),
                            add_special=True)


def build(model: Model, tokenizer: Tokenizer, template, document: Document,
          dtype: KvDtype | str = KvDtype.F16, *, fingerprint: bytes | None = None,
          on_progress: OnProgress | None = None, cancel: threading.Event | None = None) -> Cartridge:
    """Prefill the wrapped document into an empty cache and keep its rows. `cancel` set between two slices
    stops it (CartridgeCancelled)."""
    ids = prefix_ids(tokenizer, template, document)
    limit = model.args.context_length
    if len(ids) >= limit:
        raise DocumentTooLong(f"{document.name} takes {len(ids)} tokens; the model's context holds {limit} "
                              "(attach a part of it)")
    cache = model.new_cache(len(ids), dtype)
    for start in range(0, len(ids), UBATCH):
        if on_progress is not None:
            on_progress(start, len(ids))
        if cancel is not None and cancel.is_set():
            raise CartridgeCancelled(f"reading {document.name} was cancelled")
        model.feed(ids[start: start + UBATCH], cache)
    if on_progress is not None:
        on_progress(len(ids), len(ids))
    return Cartridge.from_cache(cache, ids, fingerprint or model_fingerprint(model.file), document.sha256,
                                document.name, os.path.basename(model.file.path))


@dataclass
class Attached:
    cartridge: Cartridge
    path: os.PathLike
    built: bool  # False: loaded from disk, no prefill
    refused: str | None = None  # why a stored file was not used (then it was built again)
    seconds: float = 0.0
    document: Document | None = None  # what was read (None: loaded by its hash, the file not read)
    chunk: int | None = None  # which chunk of a fleet (engine.cartridge.fleet) it serves, when it is one


def load_stored(model: Model, document: str, dtype: KvDtype | str = KvDtype.F16, *,
                directory: str | os.PathLike | None = None) -> tuple[Cartridge | None, str | None]:
    """The stored cartridge of a document (the SHA-256 of its text) for this model and cache type, marked as
    used now (the library evicts the least recently used), and None when there is none; a file that is
    damaged or foreign is refused: (None, why)."""
    dtype = KvDtype(dtype)
    fingerprint = model_fingerprint(model.file)
    path = store.path_for(cartridge_id(document, fingerprint, dtype), directory)
    if not os.path.exists(path):
        return None, None
    try:
        cart = store.load(path, model.new_cache(1, dtype), fingerprint)
    except CartridgeRefused as e:
        return None, str(e)
    os.utime(path)
    return cart, None


def attach(model: Model, tokenizer: Tokenizer, template, document: Document,
           dtype: KvDtype | str = KvDtype.F16, *, directory: str | os.PathLike | None = None,
           on_progress: OnProgress | None = None, cancel: threading.Event | None = None,
           disk_budget: int = DEFAULT_DISK_BUDGET) -> Attached:
    """The document's cartridge for this model and cache type: loaded when it is stored and sound, else
    built and stored (a damaged or foreign file is replaced), the least recently used others evicted to
    keep the folder within `disk_budget` bytes."""
    start = time.perf_counter()
    cart, refused = load_stored(model, document.sha256, dtype, directory=directory)
    if cart is not None:
        return Attached(cart, store.path_for(cart.id, directory), False, None, time.perf_counter() - start, document)
    cart = build(model, tokenizer, template, document, dtype, on_progress=on_progress, cancel=cancel)
    path = store.save(cart, directory)
    store.evict(disk_budget, directory, keep=path)
    return Attached(cart, path, True, refused, time.perf_counter() - start, document)
