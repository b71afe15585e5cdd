"""The session layer: one stored conversation, open on one model, shared by the GUI and the CLI.

A ChatSession joins the history store (the messages, as a tree with an active branch), a Conversation (the
KV cache) and the conversation's KV sidecar. Every reply renders the active branch with the model's chat
template (as much of it as the context holds, by the conversation's context policy: engine.chat.window)
and lets the Conversation keep the longest common token prefix of its cache: a sidecar that
holds a prefix of the render resumes warm (only the new turn is prefilled); an edit, a regeneration, a
deleted message or another system prompt rewinds to where the render parts and prefills from there, and
the sidecar follows (rewritten from that position, off the decoding thread).

Store writes are one transaction each: the user message is committed before its reply starts, the reply
when it ends, so a killed process keeps every finished turn, and a sidecar that resumes a consistent prefix.
A reply the store refuses (a full disk: StoreError) stays in `pending_reply` and is saved before the next
write, or by `save_pending`. A turn with tools (`with_tools`) stores each round as it ends: the reply with
its calls, then a tool message per result, which the next reply is rendered with; a round stopped midway is
stored as far as it went, every call with its result (engine.chat.tool_rounds). A turn holds the
conversation's lock (engine.platform.locks) while it streams: a turn on a conversation another process is
streaming into is refused (ConversationBusy) before anything is written.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import threading
from pathlib import Path
from typing import Callable, Iterator, Sequence

from engine.cartridge.cartridge import Cartridge
from engine.chat import ChatOptions, Conversation, Message, TurnResult
from engine.chat.options import think_options
from engine.chat.tool_render import tool_format_of
from engine.chat.tool_rounds import ToolRan, run_tool_rounds
from engine.chat.tool_text import without_call_text
from engine.chat.tool_use import ToolUse
from engine.chat.window import DEFAULT_POLICY, ContextWindow, check_policy, fit_context, longest_token
from engine.errors import FucinaError
from engine.history.store import HistoryStore
from engine.kv.sidecar_writer import WRITER
from engine.kv.state_persist import state_path
from engine.platform.locks import busy, conversation_lock
from engine.model_tokenizer import tokenizer_for
from engine.models.model import Model
from engine.platform.paths import data_dir
from engine.sampling import CHAT_DEFAULTS
from engine.platform.storage_errors import storage_error
from engine.sampling.grammar import Grammar
from engine.tools import ToolCall, Toolbox

DEFAULT_CONTEXT = 4096
DEFAULT_MAX_TOKENS = 1024
SIDECAR_SUFFIX = ".fkv"

_KEEP = object()  # "not passed" for update_settings, distinct from None (a real value: no system prompt)

OnPrefill = Callable[[int, int], None]  # (prompt tokens fed, tokens to feed)


def default_sidecar_dir() -> Path:
    return data_dir() / "sidecars"


def sidecar_path(conversation_id: str, sidecar_dir: str | os.PathLike | None = None) -> Path:
    return Path(sidecar_dir or default_sidecar_dir()) / f"{conversation_id}{SIDECAR_SUFFIX}"


def delete_conversation(store: HistoryStore, conversation_id: str, sidecar_dir=None) -> None:
    """Delete the conversation's messages and its KV sidecar."""
    store.delete_conversation(conversation_id)
    WRITER.flush()  # a write still in flight would bring the file back
    path = sidecar_path(conversation_id, sidecar_dir)
    try:
        path.unlink(missing_ok=True)
        Path(state_path(path)).unlink(missing_ok=True)  # a hybrid model's state checkpoint beside it
    except OSError as e:  # the conversation is gone; its sidecar, which nothing opens again, is left
        raise storage_error(e, path) from e


@dataclasses.dataclass(frozen=True)
class PendingReply:
    """A finished reply the store could not write yet."""
    conversation_id: str
    parent_id: str
    text: str
    meta: dict
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()

    def save(self, store: HistoryStore) -> None:
        calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls]
        store.add_message(self.conversation_id, "assistant", self.text, parent_id=self.parent_id, meta=self.meta,
                          reasoning=self.reasoning, tool_calls=calls)


def stored_message(m: dict) -> Message:
    """A history message as the chat template reads it: a reply with its tool calls, a tool message with the
    call it answers."""
    calls = tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in m["tool_calls"])
    result = m["tool_result"] or {}
    return Message(m["role"], m["content"], m["reasoning"], calls, result.get("call_id") or "",
                   result.get("name") or "")


def context_policy(settings: dict) -> str:
    """A stored conversation's context policy (engine.chat.window), validated."""
    return check_policy(settings.get("context_policy") or DEFAULT_POLICY)


def chat_options(settings: dict) -> ChatOptions:
    """A stored conversation's sampler settings (validate.SAMPLER_KEYS) as ChatOptions; what is not set
    takes the chat defaults, and an unset seed a fresh random one."""
    sampler = {k: settings[k] for k in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty")
               if settings.get(k) is not None}
    seed = settings.get("seed")
    sampler["seed"] = secrets.randbits(63) if seed is None else seed
    return ChatOptions(capacity=settings.get("ctx") or DEFAULT_CONTEXT,
                       max_tokens=settings.get("max_tokens") or DEFAULT_MAX_TOKENS,
                       sampler=dataclasses.replace(CHAT_DEFAULTS, **sampler),
                       grammar=Grammar.from_setting(settings.get("response_format")),  # the stored format
                       thinking_budget=settings.get("thinking_budget"), **think_options(settings.get("think")))


class StoredChat:
    """What every stored chat shares, whatever writes its replies (the local model here, a remote endpoint in
    engine.serving.remote_session): the history store's message tree and settings, the conversation's turn lock,
    and the reply the store refused. A subclass names its model, starts a reply (`_start`) and tells the
    turn it ended with (`_latest_turn`) and the meta stored with it (`_meta`). Single-threaded, like the
    store connection."""

    def __init__(self, store: HistoryStore, conversation_id: str):
        self.store, self.id = store, conversation_id
        if store.get_conversation(conversation_id)["model"] != self.model_name:
            store.update_settings(conversation_id, model=self.model_name)  # switched models: it re-renders
        self.last_turn: TurnResult | None = None
        self.pending_reply: PendingReply | None = None
        self._turn_lock = conversation_lock(store.path, conversation_id)
        self.last_window: ContextWindow | None = None  # what the last reply was conditioned on

    @property
    def model_name(self) -> str:
        raise NotImplementedError

    @property
    def settings(self) -> dict:
        return self.store.get_conversation(self.id)

    @property
    def prefix_rows(self) -> int:
        """Context positions held by attached documents (a local model's chats only)."""
        return 0

    def messages(self) -> list[dict]:
        """The active branch, root first."""
        return self.store.active_branch(self.id)

    # -- replies: each returns the reply's text pieces as a generator; closing it early stops the reply --

    # A message is stored before its reply is planned: one the context cannot take is refused (ContextFull)
    # but kept, to be edited, copied or deleted. `on_prefill` hears the prompt's prefill progress.

    def send(self, text: str, cancel: threading.Event | None = None, *,
             on_prefill: OnPrefill | None = None) -> Iterator[str]:
        """Add a user message to the active branch and stream the reply."""
        def branch() -> list[dict]:
            self.store.add_message(self.id, "user", text)
            return self.messages()
        return self._reply(branch, cancel, on_prefill)

    def regenerate(self, cancel: threading.Event | None = None, *,
                   on_prefill: OnPrefill | None = None) -> Iterator[str]:
        """A new alternative to the last reply (or a reply to a trailing unanswered user message)."""
        def branch() -> list[dict]:
            messages = self.messages()
            if not messages:
                raise ValueError("the conversation has no message to reply to")
            return messages[:-1] if messages[-1]["role"] == "assistant" else messages
        return self._reply(branch, cancel, on_prefill)

    def edit(self, message_id: str, text: str, cancel: threading.Event | None = None, *,
             on_prefill: OnPrefill | None = None) -> Iterator[str]:
        """Branch a user message with new text (the old one stays an alternative) and stream its reply."""
        def branch() -> list[dict]:
            if self.store.get_message(message_id)["role"] != "user":
                raise ValueError("only a user message is edited; regenerate an assistant reply instead")
            self.store.branch(message_id, text)
            return self.messages()
        return self._reply(branch, cancel, on_prefill)

    def _reply(self, prepare: Callable[[], list[dict]], cancel: threading.Event | None,
               on_prefill: OnPrefill | None) -> Iterator[str]:
        """Take the conversation's lock, save a pending reply, write the turn's messages (`prepare` returns the
        branch to answer) and start the reply; the lock is released when the reply is stored."""
        if not self._turn_lock.try_acquire():
            raise busy(self.id)
        try:
            self.save_pending()
            branch = prepare()
            if not branch or branch[-1]["role"] not in ("user", "tool"):
                raise ValueError("a reply follows a user message (or the results of the last reply's tool calls)")
            before = self._latest_turn()
            stream, reply_meta = self._start(branch, cancel, on_prefill)
        except BaseException:
            self._turn_lock.release()
            raise
        return self._store_reply(stream, before, branch[-1]["id"], reply_meta)

    def _start(self, branch: list[dict], cancel: threading.Event | None,
               on_prefill: OnPrefill | None) -> tuple[Iterator[str], dict]:
        """Start the reply to `branch` (which ends with a user message): its text pieces, and what its
        stored meta adds about the prompt."""
        raise NotImplementedError

    def _latest_turn(self) -> TurnResult | None:
        """The last turn the reply engine ended (a new object per turn)."""
        raise NotImplementedError

    def _meta(self, turn: TurnResult) -> dict:
        raise NotImplementedError

    def _store_reply(self, stream: Iterator[str], before: TurnResult | None, parent_id: str,
                     reply_meta: dict) -> Iterator[str]:
        try:
            yield from stream
        finally:
            stream.close()  # an early close stops the turn, which records it as cancelled
            try:
                turn = self._latest_turn()
                if turn is not None and turn is not before:
                    self.last_turn = turn
                    # a failed turn stores nothing (resend it); a cancelled one keeps what was shown (its
                    # reasoning too: a reply stopped while the model reasons)
                    shown = turn.text or turn.reasoning
                    if turn.finish_reason != "error" and (shown or turn.finish_reason != "cancelled"):
                        self._save_reply(PendingReply(self.id, parent_id, turn.text, self._meta(turn) | reply_meta,
                                                      turn.reasoning, turn.tool_calls))
            finally:
                self._turn_lock.release()

    def _save_reply(self, reply: PendingReply) -> None:
        self.pending_reply = reply  # kept until the store has it (a StoreError leaves it here)
        reply.save(self.store)
        self.pending_reply = None

    def save_pending(self) -> bool:
        """Store the reply a refused write left pending; True when there was one. A StoreError keeps it."""
        if self.pending_reply is None:
            return False
        self._save_reply(self.pending_reply)
        return True

    # -- the tree --

    def switch(self, message_id: str) -> None:
        """Show the branch through `message_id` (an alternative of an edited or regenerated message)."""
        self.save_pending()
        self.store.set_active_leaf(self.id, message_id)

    def delete_message(self, message_id: str) -> None:
        """Delete a message and its replies; the next reply rewinds the cache to what is left."""
        self.save_pending()
        self.store.delete_message(message_id)

    def update_settings(self, *, system_prompt=_KEEP, sampler=_KEEP) -> None:
        """Store the settings passed (the next reply follows them)."""
        changes = {k: v for k, v in (("system_prompt", system_prompt), ("sampler", sampler)) if v is not _KEEP}
        self.save_pending()
        self.store.update_settings(self.id, **changes)

    def close(self) -> None:
        """Drop the turn lock of a reply that was never read to its end."""
        self._turn_lock.release()


class ChatSession(StoredChat):
    """One open conversation on a local model. `run_stream` runs a reply's model work where the model
    computes (EngineService.relay: on the service's compute thread); by default, on the caller's thread."""

    def __init__(self, store: HistoryStore, model: Model, conversation_id: str, *, sidecar_dir=None,
                 speculation: bool = False, attachments: Sequence[Cartridge] = (),
                 run_stream: Callable[[Iterator[str]], Iterator[str]] | None = None):
        self.model = model
        self.run_stream = run_stream
        self.speculation = speculation  # a choice of this session (decoding speed), not a stored setting
        # documents the chat is served behind (their KV rows are the cache's prefix); the sidecar resumes
        # only behind the same ones
        self.attachments = list(attachments)
        self.sidecar = sidecar_path(conversation_id, sidecar_dir)
        try:
            self.sidecar.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise storage_error(e, self.sidecar.parent) from e
        super().__init__(store, conversation_id)
        self.resumed_positions = self._open_conversation(self.settings["sampler"])

    @classmethod
    def open(cls, store: HistoryStore, model: Model, conversation_id: str | None = None, *,
             sidecar_dir=None, system_prompt: str | None = None, sampler: dict | None = None,
             tools: dict | None = None, speculation: bool = False, attachments: Sequence[Cartridge] = (),
             run_stream: Callable[[Iterator[str]], Iterator[str]] | None = None) -> "ChatSession":
        """Open a stored conversation, or (conversation_id None) a new one with these settings."""
        if conversation_id is None:
            conversation_id = store.create_conversation(os.fspath(model.file.path), system_prompt=system_prompt,
                                                        sampler=sampler, tools=tools)
        return cls(store, model, conversation_id, sidecar_dir=sidecar_dir, speculation=speculation,
                   attachments=attachments, run_stream=run_stream)

    @property
    def model_name(self) -> str:
        return os.fspath(self.model.file.path)

    @property
    def context_used(self) -> int:
        return self.convo.cache.len

    @property
    def context_size(self) -> int:
        return self.convo.cache.capacity

    @property
    def prefix_rows(self) -> int:
        """Context positions the attached documents take (behind the turns)."""
        return self.convo.prefix_rows

    @property
    def reply_tokens(self) -> int:
        """Tokens of the reply in progress so far (read between its text pieces, on the engine's thread)."""
        return self.convo.reply_tokens

    @property
    def context_policy(self) -> str:
        return context_policy(self.settings["sampler"])

    def prompt_length(self) -> int:
        """Tokens of the prompt the next reply would be conditioned on (the active branch, which ends with
        a user message, rendered as far as the context holds it)."""
        return len(self._window(self.messages())[0].ids)

    def branch_tokens(self) -> int:
        """Context positions the active branch fills (what a status bar shows; the cache may still hold a
        branch left by a switch or a delete until the next reply): its render up to the last user message
        plus the reply after it."""
        return self.branch_fill()[0]

    def branch_fill(self) -> tuple[int, int]:
        """(branch_tokens, the oldest user turns the context leaves out of it). Attached documents' rows are
        not the branch's (convo.prefix_rows counts them)."""
        branch = self.messages()
        reply = 0
        if branch and branch[-1]["role"] == "assistant":
            last = branch.pop()
            reply = (last["meta"].get("generated_tokens")
                     or len(self.convo.tokenizer.encode(last["content"], add_special=False)))
        if not any(m["role"] == "user" for m in branch):
            return reply, 0
        try:
            window = self._window(branch)[0]
        except FucinaError:  # a branch no template renders, or one that cannot fit: what the cache holds
            return self.context_used - self.convo.prefix_rows, 0
        return len(window.ids) + reply, window.left_out_turns

    def _window(self, branch: list[dict]) -> tuple[ContextWindow, str | None]:
        """The part of `branch` (ending with a user message) that the reply is conditioned on, and the id of
        its first message when it leaves some out (a reply's meta keeps it as kept_from: the next reply
        keeps that start while it fits, so the prompt the cache holds is reused)."""
        system = self.settings["system_prompt"]
        messages = [Message("system", system)] if system else []
        messages += [stored_message(m) for m in branch]
        kept_from = next((m["meta"].get("kept_from") for m in reversed(branch) if m["role"] == "assistant"), None)
        ids = [m["id"] for m in branch]
        offset = len(messages) - len(branch)
        window = fit_context(messages, self._encode, capacity=self.context_size - self.convo.prefix_rows,
                             max_tokens=self.convo.options.max_tokens, policy=self.context_policy,
                             longest=longest_token(self.convo.tokenizer),
                             previous_start=offset + ids.index(kept_from) if kept_from in ids else None)
        return window, branch[window.start - offset]["id"] if window.left_out else None

    def _encode(self, messages: list[Message]) -> list[int]:
        # a chat behind attached documents continues their prefix, which carries the BOS
        return self.convo.tokenizer.encode(self.convo.render(messages),
                                           add_special=self.convo.prefix_rows == 0)

    def _start(self, branch: list[dict], cancel: threading.Event | None,
               on_prefill: OnPrefill | None) -> tuple[Iterator[str], dict]:
        """Fit the branch to the context and send it: the cache keeps what it shares with the render."""
        self.last_window, kept_from = self._window(branch)
        stream = self.convo.send_tokens(self.last_window.ids, cancel, reuse=True, on_prefill=on_prefill)
        if self.run_stream is not None:
            stream = self.run_stream(stream)
        return stream, {"left_out_turns": self.last_window.left_out_turns, "kept_from": kept_from}

    def _latest_turn(self) -> TurnResult | None:
        return self.convo.last_turn

    # -- tools --

    def with_tools(self, start: Callable[[], Iterator[str]], toolbox: Toolbox, cancel: threading.Event | None = None,
                   *, choice: str = "auto", on_prefill: OnPrefill | None = None) -> Iterator[str | ToolRan]:
        """The reply `start` begins (a send, regenerate or edit of this session) with `toolbox`'s tools offered,
        and the rounds after it (engine.chat.tool_rounds): each reply is stored with its calls, then a tool
        message per call with its result, and the next reply answers them. The toolbox does its own asking
        (engine.tools.approval); `choice` holds where its tools now can honour it (ToolUse.available). The
        stream yields a ToolRan for each call between the replies' pieces."""
        plain = self.convo.options
        self.convo.reconfigure(dataclasses.replace(plain, tools=ToolUse.available(toolbox.specs(), choice)))
        try:
            first = start()  # writes the turn's messages now, as a reply without tools does
        except BaseException:
            self.convo.reconfigure(plain)
            raise
        rounds = run_tool_rounds(self.convo, first, lambda ran: self._answer_tools(ran, cancel, on_prefill), toolbox,
                                 cancel=cancel)
        # the calls show from the stored reply (its tool_calls), not as the markup the model writes
        return self._then_without_tools(plain, without_call_text(rounds, tool_format_of(self.convo.template).opener))

    def _then_without_tools(self, plain: ChatOptions, rounds: Iterator[str | ToolRan]) -> Iterator[str | ToolRan]:
        """The rounds' stream; the session's options without tools come back when it ends."""
        try:
            yield from rounds
        finally:
            rounds.close()
            self.convo.reconfigure(plain)

    def _answer_tools(self, ran: list[ToolRan], cancel: threading.Event | None,
                      on_prefill: OnPrefill | None) -> Iterator[str]:
        """Store the calls' results as tool messages under the reply that made them, and stream the reply to them."""
        def branch() -> list[dict]:
            for r in ran:
                self.store.add_message(self.id, "tool", r.result.content, tool_result={
                    "call_id": r.call.id, "name": r.call.name, "is_error": r.result.is_error,
                    "seconds": r.result.seconds})
            return self.messages()
        return self._reply(branch, cancel, on_prefill)

    def _meta(self, turn: TurnResult) -> dict:
        s = turn.stats
        meta = {"model": self.model_name, "finish_reason": turn.finish_reason,
                "prompt_tokens": s.prompt_tokens, "reused_tokens": s.reused_tokens,
                "prefilled_tokens": s.prefilled_tokens, "generated_tokens": s.generated_tokens,
                "ttft_ms": round(s.ttft_ms, 1), "decode_tps": round(s.decode_tps, 2)}
        grammar = self.convo.options.grammar
        if grammar is not None:  # what the reply follows: the app shows a JSON reply as JSON
            meta["response_format"] = grammar.kind
        if turn.schema_warnings:  # the keywords it breaks that were checked after it was written
            meta["schema_warnings"] = list(turn.schema_warnings)
        if turn.reasoning:  # how long the model thought: "Thought for 3.2 s"
            meta["reasoning_ms"], meta["reasoning_tokens"] = round(s.reasoning_ms, 1), s.reasoning_tokens
        return meta

    # -- settings --

    def update_settings(self, *, system_prompt=_KEEP, sampler=_KEEP) -> None:
        """Store new settings and apply them: a new system prompt re-renders the chat (the next reply
        prefills from where it changes); a new sampler or context reopens the cache from the sidecar."""
        super().update_settings(system_prompt=system_prompt, sampler=sampler)
        if sampler is not _KEEP:
            self.resumed_positions = self._open_conversation(sampler or {})

    def _open_conversation(self, sampler: dict) -> int:
        context_policy(sampler)  # a stored setting that names no policy is refused on opening
        # under the turn lock: loading (or resetting) the sidecar while another process streams into it
        # would read a half-written turn or truncate the file under its writer
        if not self._turn_lock.try_acquire():
            raise busy(self.id)
        try:
            options = dataclasses.replace(chat_options(sampler), speculation=self.speculation)
            self.convo = Conversation.for_model(self.model, options, tokenizer=tokenizer_for(self.model))
            if self.attachments:
                self.convo.attach(self.attachments)
            return self.convo.enable_persistence(self.sidecar)
        except OSError as e:  # the sidecar cannot be created or reset: a full or read-only data dir
            raise storage_error(e, self.sidecar) from e
        finally:
            self._turn_lock.release()

    def set_speculation(self, on: bool) -> None:
        """Decode the next replies speculatively or not. The cache stays: speculation changes how a reply
        decodes, never what it says."""
        self.speculation = on
        self.convo.options = dataclasses.replace(self.convo.options, speculation=on)

    @property
    def sidecar_error(self) -> str | None:
        """Why the last sidecar write failed (the chat goes on; the next turn rewrites the file)."""
        return self.convo.sidecar_error

    def close(self) -> None:
        """Wait for this session's sidecar writes (`last_sidecar_failure` then says whether the last one
        failed) and drop the turn lock of a reply that was never read to its end."""
        WRITER.flush()
        super().close()

    def last_sidecar_failure(self) -> str | None:
        """Why the latest finished sidecar write failed, if it did (`sidecar_error` reports a failure at the
        turn after it, which rewrites the file)."""
        return WRITER.failure(self.sidecar)
