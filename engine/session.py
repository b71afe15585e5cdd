"""The session layer: one stored conversation, open on one model, shared by the GUI and the CLI.

A ChatSession joins the history store (the messages, as a tree with an active branch), a Conversation (the
KV cache) and the conversation's KV sidecar. Every reply renders the whole active branch with the model's
chat template and lets the Conversation keep the longest common token prefix of its cache: a sidecar that
holds a prefix of the render resumes warm (only the new turn is prefilled); an edit, a regeneration, a
deleted message or another system prompt rewinds to where the render parts and prefills from there, and
the sidecar follows (rewritten from that position, off the decoding thread).

Store writes are one transaction each: the user message is committed before its reply starts, the reply
when it ends, so a killed process keeps every finished turn, and a sidecar that resumes a consistent prefix.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import threading
import weakref
from pathlib import Path
from typing import Iterator

from engine.chat import ChatOptions, Conversation, Message, TurnResult
from engine.errors import FucinaError
from engine.history.store import HistoryStore
from engine.kv.sidecar_writer import WRITER
from engine.models.transformer import Transformer
from engine.paths import data_dir
from engine.sampling import CHAT_DEFAULTS
from engine.sampling.grammar import Grammar
from engine.tokenize import Tokenizer, load_tokenizer

DEFAULT_CONTEXT = 4096
DEFAULT_MAX_TOKENS = 1024
SIDECAR_SUFFIX = ".fkv"

_KEEP = object()  # "not passed" for update_settings, distinct from None (a real value: no system prompt)


# A model's tokenizer takes a second or more to build (Qwen's 151k-token vocabulary) and never changes:
# sessions on one loaded model share it.
_TOKENIZERS: "weakref.WeakKeyDictionary[Transformer, Tokenizer]" = weakref.WeakKeyDictionary()


def _tokenizer(model: Transformer) -> Tokenizer:
    if model not in _TOKENIZERS:
        _TOKENIZERS[model] = load_tokenizer(model.file.metadata)
    return _TOKENIZERS[model]


def default_sidecar_dir() -> Path:
    return data_dir() / "sidecars"


def sidecar_path(conversation_id: str, sidecar_dir: str | os.PathLike | None = None) -> Path:
    return Path(sidecar_dir or default_sidecar_dir()) / f"{conversation_id}{SIDECAR_SUFFIX}"


def delete_conversation(store: HistoryStore, conversation_id: str, sidecar_dir=None) -> None:
    """Delete the conversation's messages and its KV sidecar."""
    store.delete_conversation(conversation_id)
    WRITER.flush()  # a write still in flight would bring the file back
    sidecar_path(conversation_id, sidecar_dir).unlink(missing_ok=True)


def chat_options(settings: dict) -> ChatOptions:
    """A stored conversation's sampler settings (HistoryStore.SAMPLER_KEYS) as ChatOptions; what is not set
    takes the chat defaults, and an unset seed a fresh random one."""
    sampler = {k: settings[k] for k in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty")
               if settings.get(k) is not None}
    seed = settings.get("seed")
    sampler["seed"] = secrets.randbits(63) if seed is None else seed
    return ChatOptions(capacity=settings.get("ctx") or DEFAULT_CONTEXT,
                       max_tokens=settings.get("max_tokens") or DEFAULT_MAX_TOKENS,
                       sampler=dataclasses.replace(CHAT_DEFAULTS, **sampler),
                       grammar=Grammar.from_setting(settings.get("response_format")))  # the stored format


class ChatSession:
    """One open conversation. Single-threaded, like the store connection and the Conversation it holds."""

    def __init__(self, store: HistoryStore, model: Transformer, conversation_id: str, *, sidecar_dir=None):
        self.store, self.model, self.id = store, model, conversation_id
        self.sidecar = sidecar_path(conversation_id, sidecar_dir)
        self.sidecar.parent.mkdir(parents=True, exist_ok=True)
        row = store.get_conversation(conversation_id)
        if row["model"] != self.model_name:  # switched models: the history re-renders for this one
            store.update_settings(conversation_id, model=self.model_name)
        self.last_turn: TurnResult | None = None
        self.resumed_positions = self._open_conversation(row["sampler"])

    @classmethod
    def open(cls, store: HistoryStore, model: Transformer, conversation_id: str | None = None, *,
             sidecar_dir=None, system_prompt: str | None = None, sampler: dict | None = None) -> "ChatSession":
        """Open a stored conversation, or (conversation_id None) a new one with these settings."""
        if conversation_id is None:
            conversation_id = store.create_conversation(os.fspath(model.file.path), system_prompt=system_prompt,
                                                        sampler=sampler)
        return cls(store, model, conversation_id, sidecar_dir=sidecar_dir)

    @property
    def model_name(self) -> str:
        return os.fspath(self.model.file.path)

    @property
    def settings(self) -> dict:
        return self.store.get_conversation(self.id)

    @property
    def context_used(self) -> int:
        return self.convo.cache.len

    @property
    def context_size(self) -> int:
        return self.convo.cache.capacity

    def messages(self) -> list[dict]:
        """The active branch, root first."""
        return self.store.active_branch(self.id)

    def prompt_length(self) -> int:
        """Tokens of the prompt the next reply would be conditioned on (the active branch, which ends with
        a user message, rendered)."""
        return self._prompt_tokens(self.messages())

    def branch_tokens(self) -> int:
        """Context positions the active branch fills (what a status bar shows; the cache may still hold a
        branch left by a switch or a delete until the next reply): its render up to the last user message
        plus the reply after it."""
        branch = self.messages()
        reply = 0
        if branch and branch[-1]["role"] == "assistant":
            last = branch.pop()
            reply = (last["meta"].get("generated_tokens")
                     or len(self.convo.tokenizer.encode(last["content"], add_special=False)))
        try:
            return (self._prompt_tokens(branch) if branch else 0) + reply
        except FucinaError:  # a branch no template renders (an imported oddity): what the cache holds
            return self.context_used

    def _prompt_tokens(self, branch: list[dict]) -> int:
        return len(self.convo.tokenizer.encode(self._render(branch), add_special=True))

    # -- replies: each returns the reply's text pieces as a generator; closing it early stops the reply --

    def send(self, text: str, cancel: threading.Event | None = None) -> Iterator[str]:
        """Add a user message to the active branch and stream the reply."""
        self.store.add_message(self.id, "user", text)
        return self._reply(self.messages(), cancel)

    def regenerate(self, cancel: threading.Event | None = None) -> Iterator[str]:
        """A new alternative to the last reply (or a reply to a trailing unanswered user message)."""
        branch = self.messages()
        if not branch:
            raise ValueError("the conversation has no message to reply to")
        if branch[-1]["role"] == "assistant":
            branch = branch[:-1]
        return self._reply(branch, cancel)

    def edit(self, message_id: str, text: str, cancel: threading.Event | None = None) -> Iterator[str]:
        """Branch a user message with new text (the old one stays an alternative) and stream its reply."""
        if self.store.get_message(message_id)["role"] != "user":
            raise ValueError("only a user message is edited; regenerate an assistant reply instead")
        self.store.branch(message_id, text)
        return self._reply(self.messages(), cancel)

    def _reply(self, branch: list[dict], cancel: threading.Event | None) -> Iterator[str]:
        if not branch or branch[-1]["role"] != "user":
            raise ValueError("a reply follows a user message")
        stream = self.convo.send_rendered(self._render(branch), cancel, reuse=True)
        return self._store_reply(stream, branch[-1]["id"])

    def _store_reply(self, stream: Iterator[str], parent_id: str) -> Iterator[str]:
        before = self.convo.last_turn
        try:
            yield from stream
        finally:
            stream.close()  # an early close stops the turn, which records it as cancelled
            turn = self.convo.last_turn
            if turn is not before:
                self.last_turn = turn
                if turn.text or turn.finish_reason not in ("cancelled", "error"):
                    self.store.add_message(self.id, "assistant", turn.text, parent_id=parent_id,
                                           meta=self._meta(turn))

    def _render(self, branch: list[dict]) -> str:
        system = self.settings["system_prompt"]
        messages = [Message("system", system)] if system else []
        messages += [Message(m["role"], m["content"]) for m in branch]
        return self.convo.template.render_messages(messages)

    def _meta(self, turn: TurnResult) -> dict:
        s = turn.stats
        return {"model": self.model_name, "finish_reason": turn.finish_reason,
                "prompt_tokens": s.prompt_tokens, "reused_tokens": s.reused_tokens,
                "prefilled_tokens": s.prefilled_tokens, "generated_tokens": s.generated_tokens,
                "ttft_ms": round(s.ttft_ms, 1), "decode_tps": round(s.decode_tps, 2)}

    # -- the tree --

    def switch(self, message_id: str) -> None:
        """Show the branch through `message_id` (an alternative of an edited or regenerated message)."""
        self.store.set_active_leaf(self.id, message_id)

    def delete_message(self, message_id: str) -> None:
        """Delete a message and its replies; the next reply rewinds the cache to what is left."""
        self.store.delete_message(message_id)

    # -- settings --

    def update_settings(self, *, system_prompt=_KEEP, sampler=_KEEP) -> None:
        """Store new settings and apply them: a new system prompt re-renders the chat (the next reply
        prefills from where it changes); a new sampler or context reopens the cache from the sidecar."""
        changes = {k: v for k, v in (("system_prompt", system_prompt), ("sampler", sampler)) if v is not _KEEP}
        self.store.update_settings(self.id, **changes)
        if sampler is not _KEEP:
            self.resumed_positions = self._open_conversation(sampler or {})

    def _open_conversation(self, sampler: dict) -> int:
        self.convo = Conversation.for_model(self.model, chat_options(sampler), tokenizer=_tokenizer(self.model))
        return self.convo.enable_persistence(self.sidecar)

    @property
    def sidecar_error(self) -> str | None:
        """Why the last sidecar write failed (the chat goes on; the next turn rewrites the file)."""
        return self.convo.sidecar_error

    def close(self) -> None:
        """Wait for this session's sidecar writes."""
        WRITER.flush()
