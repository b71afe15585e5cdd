"""Attaching documents in the app: the engine thread's part (DocumentAttacher, a child of the worker, so
it lives on the worker's thread) and the UI's handle on it (DocumentsClient).

A document is read and its cartridge built (or loaded) on the engine thread, reporting its progress; the
UI shows every attachment of the chat on screen as a Chip: reading N% / ready / failed, and why. Documents
attach to a chat before its first message (the engine's rule): a new chat keeps them here until its first
message makes it a stored conversation, which records them (engine.cartridge.chat_documents); a stored
chat attaches its recorded ones again when it opens. Cancelling sets the job's event, which the build
checks between prefill slices, like stopping a reply.

A document longer than half the new chat's context (engine.cartridge.for_chat, as on the command line) is
read as a fleet (engine.cartridge.fleet): its parts and their index are stored, and the chat's first message
chooses the parts it is served behind (they are what the chat records).
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from engine.cartridge import store as cartridge_store
from engine.cartridge.build import DEFAULT_DISK_BUDGET, Attached
from engine.cartridge.chat_documents import record, restore
from engine.cartridge.fleet import FleetDocument
from engine.cartridge.for_chat import check_document_count, read_for_chat
from engine.cartridge.ingest import read_document
from engine.chat import template_for_model
from engine.errors import CartridgeCancelled, CartridgeRefused, FucinaError
from engine.kv.cache import KvDtype
from engine.kv.persist import model_fingerprint
from engine.model_tokenizer import tokenizer_for
from engine.serving.session import DEFAULT_CONTEXT

READING, READY, FAILED = "reading", "ready", "failed"


@dataclass(frozen=True)
class Chip:
    """One attachment of the chat on screen."""
    key: str  # the store's attachment id (a stored chat), or the job's (a new chat)
    name: str
    state: str  # READING | READY | FAILED
    tokens: int = 0
    done: int = 0  # tokens read so far, of `total` (while reading)
    total: int = 0
    reason: str = ""  # why it failed, or what happened on the way (read again, changed)

    @property
    def percent(self) -> int:
        return int(100 * self.done / self.total) if self.total else 0


@dataclass
class _NewChatDocument:
    key: str
    source: str
    attached: Attached | FleetDocument  # a fleet: the first message chooses its parts

    @property
    def name(self) -> str:
        return self.attached.document.name if isinstance(self.attached, FleetDocument) else self.attached.cartridge.name

    @property
    def rows(self) -> int:
        """Context positions it takes (a fleet: at most its budget)."""
        return self.attached.budget if isinstance(self.attached, FleetDocument) else self.attached.cartridge.rows

    def for_model(self, model) -> bool:
        if isinstance(self.attached, FleetDocument):
            return self.attached.model is model
        return self.attached.cartridge.fingerprint == model_fingerprint(model.file)


class DocumentAttacher(QObject):
    chips_changed = Signal(object)  # list[Chip]: the attachments of the chat on screen
    fill_changed = Signal()  # the new chat's documents changed the context it starts with

    def __init__(self, worker):
        super().__init__(worker)  # a child: it moves to the worker's thread with it
        self.worker = worker
        self.disk_budget = DEFAULT_DISK_BUDGET
        self.chips: list[Chip] = []
        self._new_chat: list[_NewChatDocument] = []  # ready documents of the chat not stored yet
        self._stored_id: str | None = None  # the stored chat the chips are of
        self._cancels: dict[str, threading.Event] = {}  # reading jobs, by chip key
        self._lock = threading.Lock()  # _cancels is read from the UI thread (cancel)

    # -- the worker's hooks ------------------------------------------------------------------------
    def forget_new_chat(self) -> None:
        """Another chat is opened: the documents kept for the new one are dropped."""
        self._new_chat.clear()
        self.chips = []

    def serve(self, conversation_id: str | None) -> list:
        """The cartridges a chat opening on the worker's model is served behind: a stored chat's recorded
        documents (loaded, or read again), or the new chat's (read again for a model switched since)."""
        model = self.worker.model
        self._stored_id = conversation_id
        if model is None:  # a remote endpoint's chat: documents are a local model's
            return []
        if conversation_id is None:
            for doc in self._new_chat:
                if not doc.for_model(model):
                    self._read_for_new_chat(doc)
            self._new_chat = [d for d in self._new_chat if d.for_model(model)]
            self.chips = [c for c in self.chips if c.key in {d.key for d in self._new_chat} or c.state == FAILED]
            self._show()
            return []  # a new chat is opened by its first message (new_chat_cartridges)
        rows = self.worker.store.attachments(conversation_id)
        self.chips = [Chip(r["id"], r["name"], READING, tokens=r["tokens"] or 0) for r in rows]
        self._show()
        if not rows:
            return []
        cancel = self._start(conversation_id)
        try:
            tokenizer = tokenizer_for(model)
            restored = restore(self.worker.store, conversation_id, model, tokenizer,
                               template_for_model(model.file.metadata, tokenizer), KvDtype.F16,
                               on_progress=self._progress, cancel=cancel, disk_budget=self.disk_budget)
        finally:
            self._finish(conversation_id)
        self.chips = [Chip(r.row["id"], r.row["name"], READY, r.cartridge.rows, reason=r.note or "")
                      if r.cartridge is not None else Chip(r.row["id"], r.row["name"], FAILED, reason=r.note or "")
                      for r in restored]
        self._show()
        return [r.cartridge for r in restored if r.cartridge is not None]

    def new_chat_cartridges(self, question: str) -> list:
        """The cartridges the new chat is served behind, its first message `question` choosing a fleet's
        parts (which then stand for the document: they are recorded, and shown as its chips)."""
        served = []
        for doc in self._new_chat:
            if not isinstance(doc.attached, FleetDocument):
                served.append(doc)
                continue
            parts = [_NewChatDocument(f"{doc.key}/{p.chunk}", doc.source, p) for p in doc.attached.select(question)]
            self.chips = [c for c in self.chips if c.key != doc.key] + [
                Chip(p.key, p.name, READY, p.rows) for p in parts]
            served += parts
        self._new_chat = served
        self._show()
        return [d.attached.cartridge for d in self._new_chat]

    def record(self, conversation_id: str) -> None:
        """The new chat became a stored conversation: its documents are stored with it."""
        for doc in self._new_chat:
            aid = record(self.worker.store, conversation_id, doc.source, doc.attached)
            self.chips = [replace(c, key=aid) if c.key == doc.key else c for c in self.chips]
        self._new_chat.clear()
        self._stored_id = conversation_id
        self.chips = [c for c in self.chips if c.state != FAILED]  # a failed one was never part of the chat
        self._show()

    def new_chat_fill(self) -> tuple[int, int]:
        """(tokens the new chat's documents take, the context it will have)."""
        return sum(d.rows for d in self._new_chat), self._new_chat_context()

    # -- requests from the UI ----------------------------------------------------------------------
    @Slot(str, str, object)
    def attach(self, key: str, path: str, cancel: threading.Event) -> None:
        """Read the file at `path` into a cartridge for the new chat on screen."""
        name = Path(path).name
        self.chips.append(Chip(key, name, READING))
        self._show()
        with self._lock:
            self._cancels[key] = cancel
        try:
            if self.worker.model is not None:  # a hybrid model takes one document: refused before it is read
                check_document_count(self.worker.model, len(self._new_chat) + 1)
            doc = _NewChatDocument(key, path, self._read(path, key, cancel))
            name = doc.name
            self._check_fits(doc)
        except CartridgeCancelled:
            self.chips = [c for c in self.chips if c.key != key]
        except FucinaError as e:  # a bad file, one too long, a foreign or damaged cartridge: the chat goes on
            self._set(Chip(key, name, FAILED, reason=str(e).replace(path, name)))  # the chip names the file
        else:
            self._new_chat.append(doc)
            self._set(Chip(key, name, READY, doc.rows))
            if isinstance(doc.attached, FleetDocument):
                self._set(replace(self._chip(key), reason=f"read in {len(doc.attached.chunks)} parts; your first "
                                                          "message chooses the ones the chat is served behind"))
            elif doc.attached.refused:
                self._set(replace(self._chip(key), reason=f"{doc.attached.refused}; it was read again"))
        finally:
            self._finish(key)
        self._show()
        self.fill_changed.emit()

    @Slot(str)
    def remove(self, key: str) -> None:
        """Take an attachment off the chat on screen. A stored chat reopens behind the others (its history is
        read again behind them)."""
        self.chips = [c for c in self.chips if c.key != key]
        if any(d.key == key for d in self._new_chat):
            self._new_chat = [d for d in self._new_chat if d.key != key]
            self.fill_changed.emit()
        elif self._stored_id is not None and key in {r["id"] for r in self.worker.store.attachments(self._stored_id)}:
            try:
                self.worker.store.remove_attachment(key)
            except FucinaError as e:
                self.worker.failed.emit(str(e))
            self.worker.open_conversation(self._stored_id)
            return
        self._show()

    @Slot(object)  # bytes: past a C int
    def set_disk_budget(self, budget: int) -> None:
        """The library's disk budget: applied now (least recently used cartridges go) and at every build."""
        self.disk_budget = budget
        try:
            cartridge_store.evict(budget)
        except OSError as e:
            self.worker.failed.emit(f"cannot trim the documents' cartridges to the disk budget: {e}")

    def cancel(self, key: str) -> None:
        """From the UI thread: stop reading the document of chip `key` (a stored chat's reopening: all of
        them)."""
        with self._lock:
            event = self._cancels.get(key) or self._cancels.get(self._stored_id or "")
        if event is not None:
            event.set()

    # -- helpers -------------------------------------------------------------------------------------
    def _read(self, path: str, key: str, cancel: threading.Event) -> Attached | FleetDocument:
        model = self.worker.model
        if model is None:
            raise FucinaError("no model is loaded; choose one, then attach the document")
        if self.worker.session is not None:  # the UI starts a new chat first; this is its guard
            raise FucinaError("documents attach to a chat before its first message; start a new chat")
        if path.endswith(cartridge_store.SUFFIX):
            return self._load_cartridge(path)
        tokenizer = tokenizer_for(model)
        template, document = template_for_model(model.file.metadata, tokenizer), read_document(path)
        return read_for_chat(model, tokenizer, template, document, self._new_chat_context(), KvDtype.F16,
                             on_progress=lambda done, total: self._progress(key, done, total), cancel=cancel,
                             disk_budget=self.disk_budget)

    def _read_for_new_chat(self, doc: _NewChatDocument) -> None:
        """A new chat's document, for a model switched to since it was attached."""
        cancel = self._start(doc.key)
        try:
            doc.attached = self._read(doc.source, doc.key, cancel)
        except FucinaError as e:
            self._set(Chip(doc.key, Path(doc.source).name, FAILED, reason=str(e)))
        finally:
            self._finish(doc.key)

    def _load_cartridge(self, path: str) -> Attached:
        """A cartridge file dropped on the chat: served when it is this model's, and kept in the library."""
        model = self.worker.model
        cart = cartridge_store.load(path, model.new_cache(1, KvDtype.F16), model_fingerprint(model.file))
        if Path(path).resolve() != cartridge_store.path_for(cart.id).resolve():
            cartridge_store.save(cart)
        return Attached(cart, cartridge_store.path_for(cart.id), False)

    def _check_fits(self, doc: _NewChatDocument) -> None:
        total = sum(d.rows for d in self._new_chat) + doc.rows
        context = self._new_chat_context()
        if total >= context:
            raise CartridgeRefused(f"{doc.name} takes {doc.rows:,} tokens; with "
                                   f"the chat's other documents that is {total:,} of its {context:,}-token context "
                                   "(raise the context length in Settings, or attach less)")

    def _new_chat_context(self) -> int:
        return (self.worker.new_chat_settings.get("sampler") or {}).get("ctx") or DEFAULT_CONTEXT

    def _progress(self, key: str, done: int, total: int) -> None:
        chip = self._chip(key)
        if chip is not None:
            self._set(replace(chip, state=READING, done=done, total=total))
            self._show()

    def _start(self, key: str) -> threading.Event:
        with self._lock:
            event = self._cancels[key] = threading.Event()
        return event

    def _finish(self, key: str) -> None:
        with self._lock:
            self._cancels.pop(key, None)

    def _chip(self, key: str) -> Chip | None:
        return next((c for c in self.chips if c.key == key), None)

    def _set(self, chip: Chip) -> None:
        self.chips = [chip if c.key == chip.key else c for c in self.chips]

    def _show(self) -> None:
        self.chips_changed.emit(list(self.chips))


class DocumentsClient(QObject):
    """The UI's handle on the DocumentAttacher: requests go out as queued signals; cancel sets the job's
    event directly."""

    _attach = Signal(str, str, object)
    _remove = Signal(str)
    _set_disk_budget = Signal(object)

    def __init__(self, attacher: DocumentAttacher):
        super().__init__()
        self.attacher = attacher
        self._attach.connect(attacher.attach)
        self._remove.connect(attacher.remove)
        self._set_disk_budget.connect(attacher.set_disk_budget)
        self._cancels: dict[str, threading.Event] = {}  # the attach jobs asked for, by chip key
        attacher.chips_changed.connect(self._forget_finished)

    def attach(self, path: str) -> str:
        """Read `path` into the new chat on screen; the key of its chip."""
        key = uuid.uuid4().hex
        self._cancels[key] = threading.Event()
        self._attach.emit(key, path, self._cancels[key])
        return key

    def remove(self, chip: Chip) -> None:
        """A chip's x: stops a document being read (before it starts, too), or takes a read one off the chat."""
        if chip.state != READING:
            self._remove.emit(chip.key)
        elif chip.key in self._cancels:
            self._cancels.pop(chip.key).set()
        else:  # a stored chat's document being read again
            self.attacher.cancel(chip.key)

    def set_disk_budget(self, budget: int) -> None:
        self._set_disk_budget.emit(budget)

    def _forget_finished(self, chips: list[Chip]) -> None:
        for chip in chips:
            if chip.state != READING:
                self._cancels.pop(chip.key, None)
