"""A document larger than the chat can hold, served as a fleet of chunk cartridges (spec 13.10's fleets).

The document is cut into chunks (engine.cartridge.chunks) small enough that `per_answer` of them fit the
prefix budget, each chunk becomes a cartridge of its own in the same store (a chunk is a document: its
cartridge is named by its text's hash, the model and the cache type, so the same chunk is read once), and
an index of the chunks' embeddings through the model (engine.cartridge.index) is stored next to them.
For a question, `select` ranks the chunks by cosine with the question's embedding, takes the best ones
that fit the budget, and hands them back in document order: composed, they are the chat's prefix, and
their tokens its speculation references, like any attached documents.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from engine.cartridge import index as chunk_index
from engine.cartridge import store
from engine.cartridge.build import DEFAULT_DISK_BUDGET, Attached, OnProgress, attach, prefix_ids
from engine.cartridge.cartridge import cartridge_id
from engine.cartridge.chunks import split_text
from engine.cartridge.ingest import Document
from engine.embedding import embed
from engine.errors import CartridgeCancelled, CartridgeRefused, DocumentTooLong
from engine.kv.cache import KvDtype
from engine.kv.persist import model_fingerprint
from engine.models.model import Model
from engine.tokenize import Tokenizer

PER_ANSWER = 3  # chunks one answer is served from, at most
# The tokens the reference wrapper around a chunk may take beyond its own count (its tokens can merge with
# the wrapper's at the two seams); a chunk is cut this much under its share of the budget.
_SEAM_SLACK = 4
_MIN_CHUNK = 16  # tokens: below this a chunk holds too little text to answer from


@dataclass
class FleetDocument:
    """An opened fleet: every chunk's cartridge stored and the index built. `select` loads the chosen
    chunks' rows; the rest stay on disk."""
    document: Document
    chunks: list[Document]  # in document order
    rows: list[int]  # each chunk's cartridge rows (its wrapped tokens)
    index: chunk_index.ChunkIndex | None
    budget: int  # the prefix rows the served chunks may take together
    per_answer: int
    model: Model
    tokenizer: Tokenizer
    template: object
    dtype: KvDtype
    directory: str | os.PathLike | None
    disk_budget: int

    @classmethod
    def open(cls, model: Model, tokenizer: Tokenizer, template, document: Document, budget: int,
             dtype: KvDtype | str = KvDtype.F16, *, per_answer: int = PER_ANSWER,
             directory: str | os.PathLike | None = None, on_progress: OnProgress | None = None,
             cancel: threading.Event | None = None, disk_budget: int = DEFAULT_DISK_BUDGET) -> "FleetDocument":
        """Split the document for a prefix of `budget` rows, and read what is not stored yet: the chunks'
        cartridges (a stored sound one is kept) and the index (embedding every chunk once). Progress counts
        the tokens still to prefill, for cartridges and embeddings together."""
        dtype = KvDtype(dtype)
        wrapper = len(prefix_ids(tokenizer, template, replace(document, text="")))
        chunk_budget = budget // per_answer - wrapper - _SEAM_SLACK
        if chunk_budget < _MIN_CHUNK:
            raise DocumentTooLong(f"{document.name} is longer than the {budget} tokens the attached documents may "
                                  f"take, and that budget is too small to serve it in parts; use a larger context")
        texts = [t for t in split_text(document.text.strip(), tokenizer, chunk_budget) if t.strip()]
        chunks = [Document(f"{document.name} [part {i + 1} of {len(texts)}]", document.kind, t)
                  for i, t in enumerate(texts)]
        rows = [len(prefix_ids(tokenizer, template, c)) for c in chunks]
        fleet = cls(document, chunks, rows, None, budget, per_answer, model, tokenizer, template, dtype, directory,
                    disk_budget)
        fingerprint = model_fingerprint(model.file)
        identity = {"fingerprint": fingerprint, "kv_dtype": dtype.value, "document": document.sha256,
                    "chunk_budget": chunk_budget, "chunks": [c.sha256 for c in chunks]}
        path = fleet.index_path(fingerprint, chunk_budget)
        try:
            fleet.index = chunk_index.load(path, identity)
        except CartridgeRefused:  # none yet, or built for another split or model: embed the chunks again
            pass
        missing = [not os.path.exists(store.path_for(cartridge_id(c.sha256, fingerprint, dtype), directory))
                   for c in chunks]
        embed_ids = [] if fleet.index is not None else [tokenizer.encode(c.text, add_special=True) for c in chunks]
        total = sum(r for r, m in zip(rows, missing) if m) + sum(map(len, embed_ids))
        done = 0
        embeddings = []
        for i, chunk in enumerate(chunks):
            if cancel is not None and cancel.is_set():
                raise CartridgeCancelled(f"reading {document.name} was cancelled")
            if missing[i]:
                attach(model, tokenizer, template, chunk, dtype, directory=directory, cancel=cancel,
                       disk_budget=disk_budget,
                       on_progress=None if on_progress is None else lambda d, n: on_progress(done + d, total))
                done += rows[i]
            if embed_ids:
                embeddings.append(embed(model, embed_ids[i], dtype))
                done += len(embed_ids[i])
            if on_progress is not None:
                on_progress(done, total)
        if fleet.index is None:
            fleet.index = chunk_index.ChunkIndex.from_embeddings(np.stack(embeddings), **identity)
            chunk_index.save(fleet.index, path)
        return fleet

    def index_path(self, fingerprint: bytes, chunk_budget: int) -> Path:
        """Named like a cartridge: the document and its split, the model, the cache type."""
        key = hashlib.sha256(f"{self.document.sha256}/{chunk_budget}".encode()).hexdigest()
        return Path(self.directory or store.cartridge_dir()) / (
            f"{key[:16]}-{fingerprint.hex()[:12]}-{self.dtype.value}.index{store.SUFFIX}")

    def ranked(self, question: str) -> list[int]:
        """Every chunk's index, the most similar to `question` first."""
        if not question.strip():
            raise ValueError("the chunks of a document are chosen by a question; this one is empty")
        return self.index.ranking(embed(self.model, self.tokenizer.encode(question, add_special=True), self.dtype))

    def fitting(self, ranking: list[int]) -> list[int]:
        """The chunks served for a ranking: the best first while they fit the budget (at most `per_answer`;
        the best one always fits, chunks being cut to a share of it), in document order."""
        picked, used = [], 0
        for i in ranking:
            if len(picked) == self.per_answer:
                break
            if used + self.rows[i] <= self.budget:
                picked.append(i)
                used += self.rows[i]
        return sorted(picked)

    def select(self, question: str) -> list[Attached]:
        """The cartridges of the chunks served for `question`, in document order."""
        return self.serve(self.fitting(self.ranked(question)))

    def serve(self, chunks: list[int]) -> list[Attached]:
        """These chunks' cartridges, loaded (built again when one was evicted or damaged since the fleet was
        opened)."""
        return [replace(attach(self.model, self.tokenizer, self.template, self.chunks[i], self.dtype,
                               directory=self.directory, disk_budget=self.disk_budget), chunk=i)
                for i in chunks]
