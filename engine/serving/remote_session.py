"""A stored conversation whose replies come from a remote OpenAI-compatible endpoint (engine.serving.remote).

The conversation lives in the local history store like a local one (the message tree, settings, search
and export are the store's); the endpoint only writes the replies, from the active branch sent whole each
turn. There is no KV sidecar: the cache is the server's. A reply whose stream is cut is stored with what
arrived, marked interrupted (meta finish_reason and error), and the RemoteConnectionLost goes on to the
caller.
"""

from __future__ import annotations

import json
import threading
from typing import Iterator

from engine.chat import Message, TurnResult
from engine.history.store import HistoryStore
from engine.serving.remote import RemoteClient, RemoteReply
from engine.chat.tool_render import as_plain_messages
from engine.serving.session import DEFAULT_MAX_TOKENS, OnPrefill, StoredChat, stored_message
from engine.errors import RemoteError
from engine.sampling import CHAT_DEFAULTS

# Stored response formats an OpenAI endpoint takes (its response_format); regex and Lark grammars are ours.
REMOTE_FORMATS = ("free", "json_object", "json_schema")


def check_remote_format(kind: str) -> str:
    if kind not in REMOTE_FORMATS:
        raise RemoteError(f"a remote endpoint takes only JSON response formats, not {kind!r}: choose free text, "
                          "a JSON object or a JSON schema")
    return kind


def request_params(sampler: dict) -> dict:
    """A stored conversation's settings (validate.SAMPLER_KEYS) as OpenAI request fields: the ones every
    OpenAI-compatible server takes. top_k, min_p and repeat_penalty are not among them and stay local."""
    params = {"temperature": sampler.get("temperature", CHAT_DEFAULTS.temperature),
              "top_p": sampler.get("top_p", CHAT_DEFAULTS.top_p),
              "max_tokens": sampler.get("max_tokens") or DEFAULT_MAX_TOKENS}
    if sampler.get("seed") is not None:
        params["seed"] = sampler["seed"]
    response_format = sampler.get("response_format") or {"type": "free"}
    kind = check_remote_format(response_format.get("type", "free"))
    if kind == "json_object":
        params["response_format"] = {"type": "json_object"}
    elif kind == "json_schema":
        params["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "reply", "schema": _schema(response_format.get("grammar", ""))}}
    return params


def _schema(text: str) -> dict:
    try:
        schema = json.loads(text)
    except ValueError as e:
        raise RemoteError(f"the conversation's JSON schema is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise RemoteError("the conversation's JSON schema is not a JSON object")
    return schema


class RemoteChatSession(StoredChat):
    """One open conversation answered by `client`'s endpoint and model."""

    resumed_positions = 0  # nothing to resume locally: no KV cache here
    sidecar_error = None
    context_size = 0       # the server's context is not known here

    def __init__(self, store: HistoryStore, client: RemoteClient, conversation_id: str):
        self.client = client
        self._reply_stream: RemoteReply | None = None
        super().__init__(store, conversation_id)

    @classmethod
    def open(cls, store: HistoryStore, client: RemoteClient, conversation_id: str | None = None, *,
             system_prompt: str | None = None, sampler: dict | None = None,
             tools: dict | None = None) -> "RemoteChatSession":
        """Open a stored conversation, or (conversation_id None) a new one with these settings."""
        if conversation_id is None:
            conversation_id = store.create_conversation(client.name, system_prompt=system_prompt, sampler=sampler,
                                                        tools=tools)
        return cls(store, client, conversation_id)

    @property
    def model_name(self) -> str:
        return self.client.name

    def branch_fill(self) -> tuple[int, int]:
        return 0, 0

    @property
    def reply_tokens(self) -> int:
        """The reply in progress so far, in the endpoint's streamed pieces (about a token each)."""
        return self._reply_stream.pieces if self._reply_stream is not None else 0

    def _start(self, branch: list[dict], cancel: threading.Event | None,
               on_prefill: OnPrefill | None) -> tuple[Iterator[str], dict]:
        settings = self.settings
        system = settings["system_prompt"]
        messages = [Message("system", system)] if system else []
        # a chat's past tool calls and results as plain turns: this endpoint is offered no tools
        messages += as_plain_messages([stored_message(m) for m in branch], ())
        self._reply_stream = self.client.stream_chat(messages, request_params(settings["sampler"]), cancel)
        return iter(self._reply_stream), {}

    def _latest_turn(self) -> TurnResult | None:
        return self._reply_stream and self._reply_stream.turn

    def _meta(self, turn: TurnResult) -> dict:
        s = turn.stats
        meta = {"model": self.client.name, "finish_reason": turn.finish_reason, "prompt_tokens": s.prompt_tokens,
                "reused_tokens": s.reused_tokens, "generated_tokens": s.generated_tokens,
                "ttft_ms": round(s.ttft_ms, 1), "decode_tps": round(s.decode_tps, 2)}
        if turn.error is not None:  # an interrupted reply says why it stops where it does
            meta["error"] = str(turn.error)
        kind = (self.settings["sampler"].get("response_format") or {}).get("type", "free")
        if kind != "free":  # what the reply follows: the app shows a JSON reply as JSON
            meta["response_format"] = kind
        return meta

    def set_speculation(self, on: bool) -> None:
        """Speculation is the server's business."""

    def last_sidecar_failure(self) -> str | None:
        return None
