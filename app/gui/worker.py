"""The engine thread: a QObject living on its own QThread that owns the loaded model's engine service
(engine/serving/service.py, whose compute thread is the only one running the model), its own HistoryStore
connection (SQLite connections belong to the thread that made them) and the open ChatSession: the session
renders, fits and stores each turn here, and relays its reply stream to the service's compute thread, where
it takes turns with the local server's requests.

The UI talks to it only through queued signals (EngineClient below), so no model work ever runs on the UI
thread. Reply text comes back coalesced to about 30 updates a second, each batch with the tokens written so
far and the decode rate, and a long prompt's prefill reports its progress slice by slice (with the time
spent, for an estimate of the time left) and each kernel its reading has to compile first (a model whose
kernels no warm-up compiled: nothing is read meanwhile). Stopping is the one call that bypasses the queue: the UI sets the
turn's `threading.Event`, which the engine checks between tokens and between prefill slices, so a stop (or
a conversation or model switch, which stops first) takes effect within one token or one slice.

Replies come from the loaded model, or from a remote OpenAI-compatible endpoint (`use_remote`): then the
open conversation is a RemoteChatSession, stored here like any other, and a connection lost mid-reply
keeps the text received and is reported.

The worker also runs the app's local server (app.local_server): a second adapter over the same service.

It keeps the chats' tools (engine.tools.chat_toolbox: MCP servers, built-in tools) as the settings give
them. While some are switched on, a local chat's turn offers them (ChatSession.with_tools) as `tool_choice`
says (the UI's: app.gui.tool_choice; "none" offers none), or only those the chat keeps on, as its own choice
says, where it has its own tool setting (set_chat_tools); its calls run through toolbox_for_turn(): each
call not always allowed is asked about through `approvals` (app.gui.tool_approval), and this thread waits
for the answer while the UI stays free; the calls and results are stored with the conversation as they
happen.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.gui.document_jobs import DocumentAttacher
from app.gui.tool_approval import ToolApprovals
from app.local_server import LocalServer
from engine.chat.reasoning import Thought
from engine.chat.tool_rounds import ToolRan
from engine.platform import warmup
from engine.platform.catalog import resolve_model
from engine.errors import FucinaError, HistoryError, RemoteConnectionLost, StoreError
from engine.history.store import HistoryStore
from engine.models import load_model
from engine.models.expert_plan import outlook, streaming_plan
from engine.platform.paths import data_dir
from engine.serving.remote import RemoteClient
from engine.serving.remote_session import RemoteChatSession
from engine.serving.service import EngineService
from engine.serving.session import ChatSession, OnPrefill, PendingReply, StoredChat, delete_conversation
from engine.tools.approval import AskingToolbox
from engine.tools.chat_toolbox import ChatToolbox
from engine.tools.mcp_config import McpConfigError, parse_servers
from engine.tools.toolbox import ToolSwitches

FLUSH_INTERVAL_S = 1 / 30
# The local server's slots (conversations it keeps warm) and their context, as `fucina serve`'s defaults
SERVER_SLOTS = 2
SERVER_CONTEXT = 4096
SERVER_SLOTS_DIR = "app-server-slots"  # not `fucina serve`'s: both may run on one model at once


@dataclass(frozen=True)
class EngineStatus:
    """What the status bar shows after a conversation opens or a turn ends."""
    context_used: int = 0
    context_size: int = 0
    resumed_positions: int = 0       # KV positions the open conversation loaded from its sidecar
    ttft_ms: float | None = None     # the last turn's numbers (None before the first turn)
    decode_tps: float | None = None
    reused_tokens: int = 0
    prefilled_tokens: int = 0
    finish_reason: str | None = None
    left_out_turns: int = 0          # oldest turns the context policy leaves out of the prompt
    spec_tokens_per_step: float | None = None  # the last reply's, when it decoded speculatively
    spec_acceptance: float | None = None       # accepted share of its drafted tokens (None: nothing drafted)
    attachment_tokens: int = 0       # context positions the attached documents take (counted in context_used)
    backend: str = ""                # where the model runs ("cpu", "cuda", "gpu")
    experts_note: str = ""           # a model streaming its experts from disk: what to expect of it
    experts_outlook: str = ""        #   and the figures that expectation comes from
    experts_hit_rate: float | None = None  # the routed experts it found in memory since it opened


@dataclass(frozen=True)
class PrefillProgress:
    """How far the engine has read the prompt of the reply in progress."""
    done: int
    total: int
    left_out_turns: int = 0
    elapsed_s: float = 0.0           # since reading began
    compiling_kernel: int = 0        # the kernel the reading compiles first (its count in this reply; 0: none)


@dataclass(frozen=True)
class ReplyProgress:
    """How far the reply in progress has got: its tokens so far and the decode rate since its first one."""
    tokens: int
    tokens_per_s: float | None = None  # None until two batches are apart in time


class DecodeRate:
    """The live decode rate: tokens written since the first batch over the time since it."""

    def __init__(self):
        self._first: tuple[int, float] | None = None  # (tokens, time) at the first batch

    def progress(self, tokens: int, now: float) -> ReplyProgress:
        if self._first is None:
            self._first = (tokens, now)
        first_tokens, first_at = self._first
        rate = (tokens - first_tokens) / (now - first_at) if now > first_at else None
        return ReplyProgress(tokens, rate)


class TextBatcher:
    """Collects streamed text pieces and hands them on at most every `interval` seconds. Pieces of a reply's
    reasoning (Thought) and of its answer are never joined: a change of kind hands on what was collected."""

    def __init__(self, emit: Callable[[str], None], interval: float = FLUSH_INTERVAL_S):
        self._emit, self._interval = emit, interval
        self._pending: list[str] = []
        self._last: float | None = None  # when the last batch went out; None: the first piece goes at once

    def add(self, piece: str) -> None:
        if self._pending and type(self._pending[-1]) is not type(piece):
            self.flush()
        self._pending.append(piece)
        now = time.monotonic()
        if self._last is None or now - self._last >= self._interval:
            self._last = now
            self.flush()

    def flush(self) -> None:
        if self._pending:
            kind = type(self._pending[0])
            self._emit(kind("".join(self._pending)))
            self._pending.clear()


def _describe(error: Exception) -> str:
    """Engine errors already name the problem; anything else gets its type so the dialog is not empty."""
    if isinstance(error, RemoteConnectionLost) and error.partial:
        return f"{error}. The reply so far is kept in the conversation; regenerate it to try again."
    return str(error) if isinstance(error, FucinaError) else f"{type(error).__name__}: {error}"


class EngineWorker(QObject):
    model_loading = Signal(str)           # path
    model_loaded = Signal(str)            # path
    model_failed = Signal(str, str)       # path, what is wrong with it
    remote_connected = Signal(str)        # the remote endpoint's model and URL, now answering the chats
    remote_failed = Signal(str)           # why the endpoint cannot be used (the model in use stays)
    server_changed = Signal(object)       # the local server's (url, api key), or None once it stopped
    server_failed = Signal(str)           # why the local server did not start
    conversation_ready = Signal(object)   # conversation id, or None for a new chat not saved yet
    conversation_created = Signal(str, object)  # a new chat's first message made it a conversation; the turn
    # A turn is identified by its cancel event, so the UI can ignore a turn it has abandoned.
    reply_text = Signal(str, object)      # the next coalesced piece of the reply, the turn
    reply_reasoning = Signal(str, object)  # the next coalesced piece of the reply's reasoning, the turn
    turn_finished = Signal(object, object)  # conversation id (None: none was made), the turn; stored now
    # PrefillProgress, the turn; emitted on the engine service's compute thread, where the prompt is read
    # (a receiver on this thread would hear of it only after the turn)
    prefill_progress = Signal(object, object)
    reply_progress = Signal(object, object)    # ReplyProgress, sent with each batch of reply text; the turn
    branch_changed = Signal(str)          # conversation id, after a switch or a delete
    conversation_deleted = Signal(str)
    status_changed = Signal(object)       # EngineStatus
    failed = Signal(str)                  # a request the engine refused
    # The disk refused a write: why, the text of a reply kept in memory until it is saved (or None), and the
    # text of a message that was not sent (or None). storage_recovered: writes work again, nothing is pending.
    storage_failed = Signal(str, object, object)
    storage_recovered = Signal()
    tool_allowed_always = Signal(str)     # the user allowed a tool always: the UI keeps it in the preferences

    def __init__(self, db_path: Path, sidecar_dir: Path | None = None):
        super().__init__()
        self._db_path, self._sidecar_dir = db_path, sidecar_dir
        self._store: HistoryStore | None = None
        self.model = None
        self.remote: RemoteClient | None = None    # replies come from this endpoint rather than `model`
        self.session: StoredChat | None = None
        self._conversation_id: str | None = None  # what the UI shows; None: a new chat
        self._pending_settings: dict = {}          # settings for the new chat, applied when it is created
        self._storage_failing = False              # the last write was refused (the UI shows a banner)
        self._unsaved: list[PendingReply] = []     # refused replies of sessions closed since, oldest first
        self.speculation = False                   # decode replies speculatively (the app's preference)
        self.service: EngineService | None = None  # the loaded model's: every reply computes on its thread
        self.server: LocalServer | None = None     # the local server over the service, while it runs
        self.documents = DocumentAttacher(self)    # attached documents (app.gui.document_jobs)
        self.documents.fill_changed.connect(self._emit_status)
        self.approvals = ToolApprovals(self)       # tool calls asked about; the UI answers them
        self._tools: ChatToolbox | None = None     # made when the settings first give it servers and switches
        self.tool_choice = "auto"                  # how replies are offered the tools (engine.chat.tool_use)
        self.expert_cache_bytes: int | None = None  # a streamed model's experts' cache (None: from free memory)
        self._experts_outlook = None               # the loaded model's StreamOutlook, when it streams experts

    @property
    def new_chat_settings(self) -> dict:
        """The settings the new chat on screen will be created with."""
        return self._pending_settings

    @property
    def store(self) -> HistoryStore:
        if self._store is None:  # made on first use, which is on this worker's thread
            self._store = HistoryStore(self._db_path)
        return self._store

    # -- model and conversation --------------------------------------------------------------------
    @Slot(str)
    def load_model(self, path: str) -> None:
        self.model_loading.emit(path)
        try:
            # a starter model changed on disk is refused here
            model = load_model(resolve_model(path), experts=streaming_plan(self.expert_cache_bytes))
            expected = outlook(model) if getattr(model, "expert_store", None) is not None else None
            service = EngineService(model, slots=SERVER_SLOTS, capacity=SERVER_CONTEXT,
                                    sidecar_dir=data_dir() / SERVER_SLOTS_DIR, open_slots_at_first_job=True)
        except Exception as e:  # a corrupt file may fail anywhere in parsing; the old model stays
            self.model_failed.emit(path, _describe(e))
            return
        self._close_session()
        self._drop_model()  # and the server on it
        self._drop_remote()
        self.model, self.service, self._experts_outlook = model, service, expected
        self.model_loaded.emit(path)
        self._open_session()

    @Slot(dict)
    def use_remote(self, endpoint: dict) -> None:
        """Answer the chats through the endpoint {"url", "api_key", "model"}: checked (it answers, takes the
        key, serves the model) before the model in use is let go."""
        try:
            client = RemoteClient(endpoint.get("url", ""), endpoint.get("api_key"), endpoint.get("model"))
            try:
                client.choose_model()
            except FucinaError:
                client.close()
                raise
        except FucinaError as e:
            self.remote_failed.emit(str(e))
            return
        self._close_session()
        self._drop_model()
        self._drop_remote()
        self.remote = client
        self.remote_connected.emit(client.name)
        self._open_session()

    @Slot(object)
    def set_expert_cache(self, budget: int | None) -> None:
        """The experts' cache of a model too large for memory, from the next load (None: from free memory)."""
        self.expert_cache_bytes = budget

    def _drop_model(self) -> None:
        self.stop_server()
        if self.service is not None:
            self.service.close()
        store = getattr(self.model, "expert_store", None)
        if store is not None:
            try:
                store.save_usage()  # what pins its experts at the next load
            except OSError:
                pass  # it only ever chooses pins
            store.close()
        self.model = self.service = self._experts_outlook = None

    def _drop_remote(self) -> None:
        if self.remote is not None:
            self.remote.close()
            self.remote = None

    @Slot(object)
    def open_conversation(self, conversation_id: str | None) -> None:
        self._close_session()
        self.documents.forget_new_chat()
        self.pick_file(None)  # a file picked for the tools is the chat's it was picked in
        self._conversation_id, self._pending_settings = conversation_id, {}
        self._open_session()

    def _open(self, conversation_id: str | None, attachments=(), **settings) -> StoredChat:
        """The conversation (None: a new one with `settings`) on the remote endpoint or the loaded model,
        behind its attached documents (a local model's only)."""
        if self.remote is not None:
            return RemoteChatSession.open(self.store, self.remote, conversation_id, **settings)
        return ChatSession.open(self.store, self.model, conversation_id, sidecar_dir=self._sidecar_dir,
                                speculation=self.speculation, run_stream=self.service.relay,
                                attachments=attachments, **settings)

    @property
    def _ready(self) -> bool:
        return self.model is not None or self.remote is not None

    def _open_session(self) -> None:
        if not self._ready:
            return
        try:
            attachments = self.documents.serve(self._conversation_id)  # a new chat's: read again for this model
            if self._conversation_id is not None:
                self.session = self._open(self._conversation_id, attachments=attachments)
        except FucinaError as e:
            self._report(e)
            return
        self.conversation_ready.emit(self._conversation_id)
        self._emit_status()

    def _close_session(self) -> None:
        if self.session is not None:
            if self.session.pending_reply is not None:  # kept for Retry (or the next write) after the switch
                self._unsaved.append(self.session.pending_reply)
            self.session.close()
            self.session = None

    def _session(self) -> StoredChat:
        if not self._ready:
            raise FucinaError("no model is loaded; choose one in the model picker")
        if self.session is None:
            raise FucinaError("no conversation is open")
        return self.session

    def _session_for_turn(self, turn: threading.Event, text: str | None) -> StoredChat:
        """The open conversation; a new chat becomes a stored conversation with its first message `text`
        (which chooses the parts of a long document it is served behind)."""
        if self._ready and self.session is None and self._conversation_id is None:
            self.session = self._open(None, **self._pending_settings,
                                      attachments=self.documents.new_chat_cartridges(text or ""))
            self._conversation_id, self._pending_settings = self.session.id, {}
            self.documents.record(self.session.id)
            self.conversation_created.emit(self.session.id, turn)
        return self._session()

    # -- turns -------------------------------------------------------------------------------------
    @Slot(str, object)
    def send(self, text: str, cancel: threading.Event) -> None:
        self._turn(lambda s, progress: s.send(text, cancel, on_prefill=progress), cancel, text)

    @Slot(object)
    def regenerate(self, cancel: threading.Event) -> None:
        self._turn(lambda s, progress: s.regenerate(cancel, on_prefill=progress), cancel)

    @Slot(str, str, object)
    def edit(self, message_id: str, text: str, cancel: threading.Event) -> None:
        self._turn(lambda s, progress: s.edit(message_id, text, cancel, on_prefill=progress), cancel)

    def _turn(self, start: Callable[[ChatSession, OnPrefill], Iterator[str]], cancel: threading.Event,
              text: str | None = None) -> None:
        """`text`: the message sent, handed back to the UI when the store refuses it."""
        session = None
        rate = DecodeRate()
        reading_since: float | None = None
        reading: tuple[PrefillProgress, int] | None = None  # the last slice reported, and the reading thread

        def reply_batch(text: str) -> None:
            (self.reply_reasoning if isinstance(text, Thought) else self.reply_text).emit(text, cancel)
            self.reply_progress.emit(rate.progress(session.reply_tokens, time.monotonic()), cancel)

        def progress(done: int, total: int) -> None:
            nonlocal reading_since, reading
            now = time.monotonic()
            reading_since = now if reading_since is None else reading_since
            left_out = session.last_window.left_out_turns if session.last_window else 0
            reading = PrefillProgress(done, total, left_out, now - reading_since), threading.get_ident()
            self.prefill_progress.emit(reading[0], cancel)

        kernels = 0  # compiled while the prompt was read (a first run's, or a weight format's first)

        def compiling(_count: int) -> None:
            """Nothing is read while a kernel compiles: the status says so instead of "reading 0 / N"."""
            nonlocal kernels
            if reading is None or reading[1] != threading.get_ident() or reading[0].done >= reading[0].total:
                return  # another thread's kernel (speculation's, compiling in the background), or after the reading
            kernels += 1
            self.prefill_progress.emit(replace(reading[0], compiling_kernel=kernels), cancel)

        batcher = TextBatcher(reply_batch)

        try:
            try:
                session = self._session_for_turn(cancel, text)
                # writes the turn's messages (a StoreError here: nothing was sent)
                stream = self._offering_tools(session, lambda: start(session, progress), cancel, progress)
            except StoreError as e:
                self._report(e, unsent=text)
                return
            with warmup.counting_compiles(compiling):
                for piece in stream:
                    if isinstance(piece, ToolRan):  # shown through the approvals; the next round's text follows
                        batcher.flush()
                    else:
                        batcher.add(piece)
            self._save_unsaved()
            self._stored()
            self._tell_sidecar_failure(session)
        except Exception as e:  # the reply ends, the app and the conversation stay usable
            self._report(e)
        finally:
            batcher.flush()
            self._emit_status()  # first, so the turn's numbers are shown by the time it counts as ended
            self.turn_finished.emit(session and session.id, cancel)

    # -- edits that need no model work -------------------------------------------------------------
    @Slot(str)
    def switch(self, message_id: str) -> None:
        self._change_branch(lambda s: s.switch(message_id))

    @Slot(str)
    def delete_message(self, message_id: str) -> None:
        self._change_branch(lambda s: s.delete_message(message_id))

    def _change_branch(self, change: Callable[[ChatSession], None]) -> None:
        try:
            session = self._session()
            change(session)
        except FucinaError as e:
            self._report(e)
            return
        self._stored()
        self.branch_changed.emit(session.id)
        self._emit_status()

    @Slot(str)
    def delete_conversation(self, conversation_id: str) -> None:
        if conversation_id == self._conversation_id:
            self.open_conversation(None)
        try:
            delete_conversation(self.store, conversation_id, self._sidecar_dir)
        except FucinaError as e:
            self._report(e)
            return
        self.conversation_deleted.emit(conversation_id)

    @Slot(dict)
    def update_settings(self, settings: dict) -> None:
        """`settings` holds system_prompt and/or sampler (engine keys, context length as `ctx`)."""
        if self.session is None:
            self._pending_settings.update(settings)
            return
        try:
            self.session.update_settings(**settings)
        except FucinaError as e:
            self._report(e)
        self._emit_status()

    @Slot(bool)
    def set_speculation(self, on: bool) -> None:
        """From the next reply on, in this conversation and the ones opened after it."""
        self.speculation = on
        if self.session is not None:
            self.session.set_speculation(on)

    @Slot()
    def save_pending(self) -> None:
        """Retry storing the replies the disk refused."""
        try:
            saved = self._save_unsaved()
            if self.session is not None:
                saved += self.session.save_pending()
        except StoreError as e:
            self._report(e)
            return
        self._stored()
        if saved and self.session is not None:
            self.branch_changed.emit(self.session.id)

    def _save_unsaved(self) -> int:
        """Store the refused replies of sessions closed since; a StoreError keeps the rest."""
        saved = 0
        while self._unsaved:
            try:
                self._unsaved[0].save(self.store)
            except HistoryError:  # its conversation was deleted since: nothing to keep it in
                pass
            self._unsaved.pop(0)
            saved += 1
        return saved

    def _pending(self) -> PendingReply | None:
        """The newest reply kept in memory until the store takes it."""
        if self.session is not None and self.session.pending_reply is not None:
            return self.session.pending_reply
        return self._unsaved[-1] if self._unsaved else None

    def _report(self, error: Exception, unsent: str | None = None) -> None:
        """A refused write goes to the storage banner (with what is kept in memory), anything else to `failed`."""
        if not isinstance(error, StoreError):
            self.failed.emit(_describe(error))
            return
        self._storage_failing = True
        pending = self._pending()
        self.storage_failed.emit(str(error), pending and pending.text, unsent)

    def _stored(self) -> None:
        """A write went through: the banner goes once nothing is kept in memory any more."""
        if self._storage_failing and self._pending() is None:
            self._storage_failing = False
            self.storage_recovered.emit()

    def _tell_sidecar_failure(self, session: ChatSession) -> None:
        """A failed sidecar write costs only warmth (the next turn rewrites the file), but is told."""
        if session.sidecar_error:
            self._storage_failing = True
            self.storage_failed.emit(f"{session.sidecar_error}. The conversation is saved; only its KV cache is "
                                     "not, and the next reply rewrites it.", None, None)

    def _experts_status(self) -> dict:
        """EngineStatus's fields on a model streaming its experts."""
        if self._experts_outlook is None:
            return {}
        stats = self.model.expert_store.stats
        return {"experts_note": self._experts_outlook.headline(), "experts_outlook": self._experts_outlook.note(),
                "experts_hit_rate": stats.hit_rate if stats.hits + stats.misses else None}

    def _emit_status(self) -> None:
        s = self.session
        if s is None:  # a new chat: only the documents attached to it so far
            tokens, context = self.documents.new_chat_fill()
            experts = self._experts_status()
            self.status_changed.emit(EngineStatus(tokens, context, attachment_tokens=tokens, **experts) if tokens
                                     else EngineStatus(**experts))
            return
        turn = s.last_turn
        stats = turn.stats if turn is not None else None
        used, left_out = s.branch_fill()
        spec = stats and stats.spec
        self.status_changed.emit(EngineStatus(
            context_used=used + s.prefix_rows, attachment_tokens=s.prefix_rows,
            context_size=s.context_size, resumed_positions=s.resumed_positions,
            ttft_ms=stats and stats.ttft_ms, decode_tps=stats and stats.decode_tps,
            reused_tokens=stats.reused_tokens if stats else 0, prefilled_tokens=stats.prefilled_tokens if stats else 0,
            finish_reason=turn and turn.finish_reason, left_out_turns=left_out,
            spec_tokens_per_step=spec.tokens_per_step() if spec and spec.steps else None,
            spec_acceptance=spec.acceptance_rate() if spec and spec.drafted else None,
            backend=self.model.backend.name if self.model is not None else "remote", **self._experts_status()))

    # -- tools -------------------------------------------------------------------------------------
    @Slot(str, object)
    def configure_tools(self, servers_json: str, switches: ToolSwitches) -> None:
        """The MCP servers' JSON and the tool switches (the preferences'), from the next call on."""
        try:
            servers = parse_servers(servers_json)
        except McpConfigError as e:  # the settings refuse such text; a hand-edited preferences file may not
            self.failed.emit(f"{e}. The MCP servers are not used until it is fixed in the settings.")
            servers = {}
        self._chat_tools().configure(servers, switches)

    @Slot(str)
    def set_tool_choice(self, choice: str) -> None:
        """From the next turn on: "auto", "required", "none" or a switched-on tool's name (engine.chat.tool_use)."""
        self.tool_choice = choice

    @Slot(object)
    def pick_file(self, path: str | None) -> None:
        """The one file the read_file tool may read in this chat (None: none)."""
        if path is not None or self._tools is not None:
            self._chat_tools().picked.pick(path)

    @Slot(object)
    def set_chat_tools(self, tools: dict | None) -> None:
        """The open chat's own tool setting ({"enabled": [names], "choice": ...}; None: the app's defaults),
        stored with it, or with a new chat once its first message makes it."""
        if self._conversation_id is None:
            self._pending_settings["tools"] = tools
            return
        try:
            self.store.update_settings(self._conversation_id, tools=tools)
        except FucinaError as e:
            self._report(e)

    def _chat_tool_setting(self) -> dict | None:
        """The open chat's own tool setting (None: it follows the app's)."""
        if self._conversation_id is None:
            return self._pending_settings.get("tools")
        return self.store.get_conversation(self._conversation_id)["tools"]

    def toolbox_for_turn(self, turn: threading.Event, enabled: frozenset[str] | None = None) -> AskingToolbox:
        """The switched-on tools for the turn (only those in `enabled`, the chat's own, where given), each call
        asked about first unless always allowed (the UI shows it; a stopped turn is a denial)."""
        return self._chat_tools().asking(
            lambda call: self.approvals.ask(call, turn), on_always=self.tool_allowed_always.emit,
            on_result=lambda call, result: self.approvals.tell_result(call, result, turn), enabled=enabled)

    def _offering_tools(self, session: StoredChat, start: Callable[[], Iterator[str]], cancel: threading.Event,
                        progress: OnPrefill) -> Iterator[str | ToolRan]:
        """The turn `start` begins, offering the tools on in this chat where some are (a local model's chats: a
        remote endpoint's replies are written there) as its choice says (the app's where the chat keeps
        none): calls, results and the replies after them are stored in the conversation as they come."""
        if self._tools is None or not isinstance(session, ChatSession):
            return start()
        own = self._chat_tool_setting()
        switched_on = self._tools.toolbox.switches.enabled
        enabled = switched_on & frozenset(own["enabled"]) if own else switched_on
        choice = own["choice"] if own else self.tool_choice
        if not enabled or choice == "none":
            return start()
        return session.with_tools(start, self.toolbox_for_turn(cancel, enabled), cancel, choice=choice,
                                  on_prefill=progress)

    def _chat_tools(self) -> ChatToolbox:
        if self._tools is None:
            self._tools = ChatToolbox(self._db_path, lambda: self._conversation_id)
        return self._tools

    # -- the local server --------------------------------------------------------------------------
    @Slot(int, str)
    def start_server(self, port: int, api_key: str) -> None:
        """Serve the loaded model on loopback (port 0: a free one), behind `api_key`."""
        if self.server is None:
            try:
                if self.model is None:
                    raise FucinaError("the local server serves a model loaded in the app; load one first"
                                      + (" (a remote endpoint's model is served by its own server)"
                                         if self.remote is not None else ""))
                self.server = LocalServer(self.service, port=port, api_key=api_key)
            except FucinaError as e:
                self.server_failed.emit(str(e))
                return
        self.server_changed.emit((self.server.url, self.server.api_key))

    @Slot()
    def stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
            self.server_changed.emit(None)

    @Slot()
    def shutdown(self) -> None:
        self._close_session()
        self._drop_model()
        try:
            self._save_unsaved()  # a last try: space may have come back since the banner
        except StoreError:
            pass  # the reply was offered for copy; there is nowhere left to keep it
        self._drop_remote()
        if self._tools is not None:
            self._tools.close()  # and the MCP servers it started
        if self._store is not None:
            self._store.close()
        QThread.currentThread().quit()


class EngineClient(QObject):
    """The UI's handle on the engine thread: requests go out as queued signals, each turn gets its own
    cancel event, and `stop` sets it directly."""

    _load_model = Signal(str)
    _use_remote = Signal(dict)
    _start_server = Signal(int, str)
    _stop_server = Signal()
    _open_conversation = Signal(object)
    _send = Signal(str, object)
    _regenerate = Signal(object)
    _edit = Signal(str, str, object)
    _switch = Signal(str)
    _delete_message = Signal(str)
    _delete_conversation = Signal(str)
    _update_settings = Signal(dict)
    _set_speculation = Signal(bool)
    _save_pending = Signal()
    _configure_tools = Signal(str, object)
    _set_tool_choice = Signal(str)
    _set_chat_tools = Signal(object)
    _pick_file = Signal(object)
    _set_expert_cache = Signal(object)
    _shutdown = Signal()

    def __init__(self, db_path: Path, sidecar_dir: Path | None = None):
        super().__init__()
        self.worker = EngineWorker(db_path, sidecar_dir)
        self.thread = QThread()
        self.thread.setObjectName("fucina-engine")
        self.worker.moveToThread(self.thread)
        for name in ("load_model", "use_remote", "open_conversation", "send", "regenerate", "edit", "switch",
                     "delete_message", "delete_conversation", "update_settings", "set_speculation", "save_pending",
                     "start_server", "stop_server", "configure_tools", "set_tool_choice", "set_chat_tools",
                     "pick_file", "set_expert_cache", "shutdown"):
            getattr(self, f"_{name}").connect(getattr(self.worker, name))
        self._cancel = threading.Event()
        self.thread.start()

    @property
    def current_turn(self) -> threading.Event:
        return self._cancel

    def stop(self) -> None:
        """Stop the reply; what it wrote so far is kept and still reported."""
        self._cancel.set()

    def _new_turn(self) -> threading.Event:
        """Stop any reply still running and start a new turn; the old one's late signals are stale."""
        self._cancel.set()
        self._cancel = threading.Event()
        return self._cancel

    def load_model(self, path: str) -> None:
        self._new_turn()
        self._load_model.emit(path)

    def use_remote(self, endpoint: dict) -> None:
        self._new_turn()
        self._use_remote.emit(endpoint)

    def open_conversation(self, conversation_id: str | None) -> None:
        self._new_turn()
        self._open_conversation.emit(conversation_id)

    def send(self, text: str) -> None:
        self._send.emit(text, self._new_turn())

    def regenerate(self) -> None:
        self._regenerate.emit(self._new_turn())

    def edit(self, message_id: str, text: str) -> None:
        self._edit.emit(message_id, text, self._new_turn())

    def switch(self, message_id: str) -> None:
        self._switch.emit(message_id)

    def delete_message(self, message_id: str) -> None:
        self._delete_message.emit(message_id)

    def delete_conversation(self, conversation_id: str) -> None:
        self._delete_conversation.emit(conversation_id)

    def update_settings(self, settings: dict) -> None:
        self._update_settings.emit(settings)

    def set_speculation(self, on: bool) -> None:
        self._set_speculation.emit(on)

    def save_pending(self) -> None:
        """Retry storing a reply the disk refused (storage_failed / storage_recovered tell how it went)."""
        self._save_pending.emit()

    def start_server(self, port: int, api_key: str) -> None:
        """Serve the loaded model locally (server_changed / server_failed tell how it went)."""
        self._start_server.emit(port, api_key)

    def stop_server(self) -> None:
        self._stop_server.emit()

    def configure_tools(self, servers_json: str, switches: ToolSwitches) -> None:
        """The tools' settings (app.gui.tools_dialog), from the next tool call on."""
        self._configure_tools.emit(servers_json, switches)

    def set_tool_choice(self, choice: str) -> None:
        """How the next turns are offered the tools (app.gui.tool_choice)."""
        self._set_tool_choice.emit(choice)

    def set_chat_tools(self, tools: dict | None) -> None:
        """The open chat's own tools and choice, kept with it (None: the app's defaults)."""
        self._set_chat_tools.emit(tools)

    def pick_file(self, path: str | None) -> None:
        """The file the read_file tool may read in the open chat, and no other."""
        self._pick_file.emit(path)

    def set_expert_cache(self, budget: int | None) -> None:
        """The experts' cache of a model too large for memory with them mapped, from the next model load (None:
        most of the memory free then)."""
        self._set_expert_cache.emit(budget)

    def close(self) -> None:
        """Stop any reply, let the worker flush its session, and wait for the thread to end: a reply stops
        within a token, a model load ends in seconds, and a thread still running Python code while the app
        tears down crashes it."""
        self.stop()
        self._shutdown.emit()
        self.thread.wait()
