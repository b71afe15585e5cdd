"""Anthropic's Messages API (POST /v1/messages) over the server's chat requests.

`system` and `messages` (text, tool_use, tool_result and thinking blocks) become the chat's messages, a
tool_result becoming the tool message that answers its call; `tools` (input_schema) and `tool_choice`
(auto, any, tool, none) the chat's tools, held to their schemas as on /v1/chat/completions; `thinking`
(enabled with a budget of tokens, or disabled) the reasoning's budget or its closing in the prompt. A reply
is a message whose content blocks are its thinking, its text and its tool_use calls, whole or streamed as
Anthropic's events; one that a `stop_sequences` entry ended names it (stop_sequence). Errors take
Anthropic's shape: {type: error, error: {type, message}}.
"""

from __future__ import annotations

import secrets
from typing import Any

from app.server_requests import (
    ApiError, Call, Limits, boolean, checked_text, content_text, integer, model_field, sampler_of,
    tool_message, tool_use)
from app.server_stream import REASONING, PartStream, arguments_json, sse, whole_parts
from engine.chat import Message
from engine.serving.service import JobResult
from engine.tools import ToolCall

PATH = "/v1/messages"
MAX_STOP_SEQUENCES = 16
STOP_REASONS = {"stop": "end_turn", "cancelled": "end_turn", "stop_sequence": "stop_sequence",
                "length": "max_tokens", "length_closed": "max_tokens", "context": "max_tokens"}
CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # and "tool": the one it names
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def error_body(error: ApiError) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(error.status, "api_error"), "message": error.message}}


def parse(body: dict, limits: Limits, model: str) -> tuple[Call, "MessagesReply"]:
    """A Messages request as the chat request it asks for, and the writer of its reply."""
    if body.get("max_tokens") is None:
        raise ApiError(400, "'max_tokens' is required", param="max_tokens", code="missing_required_parameter")
    max_tokens = integer(body, "max_tokens", 1, limits.max_tokens, None)
    think_off, budget = _thinking(body.get("thinking"), max_tokens)
    sampler = sampler_of(body, max_temperature=1.0, top_k=integer(body, "top_k", 0, 1 << 31, 0))
    call = Call(model_field(body), boolean(body, "stream", False), False, _system(body.get("system")) + _messages(body),
                None, max_tokens, sampler, _stop(body.get("stop_sequences")), None, limits.speculation,
                tools=_tools(body), think_off=think_off, thinking_budget=budget)
    return call, MessagesReply(model, call.stop)


def _system(system: Any) -> list[Message]:
    if system is None or system == "":
        return []
    return [Message("system", content_text(system, "system"))]


def _thinking(thinking: Any, max_tokens: int) -> tuple[bool, int | None]:
    """(think_off, thinking_budget) for `thinking`: enabled with budget_tokens, adaptive, or disabled."""
    if thinking is None:
        return False, None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind in ("disabled", "adaptive"):  # adaptive: as the model's template thinks by default
        return kind == "disabled", None
    budget = thinking.get("budget_tokens") if kind == "enabled" else None
    if not isinstance(budget, int) or isinstance(budget, bool) or not 0 < budget < max_tokens:
        raise ApiError(400, "'thinking' must be {type: disabled}, {type: adaptive} or {type: enabled, budget_tokens} "
                       "with a budget of at least 1 and below max_tokens", param="thinking", code="invalid_value")
    return False, budget


def _stop(stops: Any) -> tuple[str, ...]:
    if stops is None:
        return ()
    if (not isinstance(stops, list) or len(stops) > MAX_STOP_SEQUENCES
            or not all(isinstance(s, str) and s for s in stops)):
        raise ApiError(400, f"'stop_sequences' must be an array of at most {MAX_STOP_SEQUENCES} non-empty strings",
                       param="stop_sequences", code="invalid_type")
    return tuple(checked_text(s, "stop_sequences") for s in stops)


def _tools(body: dict):
    tools, choice = body.get("tools"), body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if choice is not None and kind not in (*CHOICES, "tool"):
        raise ApiError(400, "'tool_choice' must be {type: auto}, {type: any}, {type: tool, name} or {type: none}",
                       param="tool_choice", code="invalid_value")
    if tools is None:
        if kind not in (None, "auto", "none"):
            raise ApiError(400, "'tool_choice' needs 'tools'", param="tool_choice", code="invalid_value")
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type", "custom") == "custom"
                                              for t in tools):
        raise ApiError(400, "'tools' must be an array of {name, description, input_schema} (client tools)",
                       param="tools", code="invalid_value")
    functions = [{"type": "function", "name": t.get("name"), "description": t.get("description", ""),
                  "parameters": t.get("input_schema")} for t in tools]
    return tool_use(functions, choice.get("name") if kind == "tool" else CHOICES.get(kind))


def _messages(body: dict) -> list[Message]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty array of {role, content} objects", param="messages",
                       code="missing_required_parameter" if messages is None else "invalid_type")
    out: list[Message] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant"):
            raise ApiError(400, f"'{where}.role' must be user or assistant", param=f"{where}.role",
                           code="invalid_value")
        content = m.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
            raise ApiError(400, f"'{where}.content' must be a string or an array of content blocks",
                           param=f"{where}.content", code="invalid_type")
        out += (_assistant if role == "assistant" else _user)(blocks, out, f"{where}.content")
    return out


def _user(blocks: list[dict], before: list[Message], where: str) -> list[Message]:
    """A user turn: its tool results (each the tool message answering its call), then its text."""
    out, text = [], []
    for j, block in enumerate(blocks):
        at = f"{where}[{j}]"
        if block.get("type") == "tool_result":
            result = content_text(block.get("content", ""), f"{at}.content")
            out.append(tool_message(block.get("tool_use_id"), Message("tool", result), before + out,
                                    f"{at}.tool_use_id"))
        elif block.get("type") == "text":
            text.append(content_text([block], at))
        else:
            raise ApiError(400, f"'{at}' must be a text or tool_result block", param=at, code="invalid_value")
    return out + ([Message("user", "".join(text))] if text or not out else [])


def _assistant(blocks: list[dict], before: list[Message], where: str) -> list[Message]:
    """An assistant turn: its thinking, its text and its tool_use calls, as one message."""
    text, reasoning, calls = [], [], []
    for j, block in enumerate(blocks):
        at, kind = f"{where}[{j}]", block.get("type")
        if kind == "text":
            text.append(content_text([block], at))
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            reasoning.append(checked_text(block["thinking"], f"{at}.thinking"))
        elif kind == "tool_use" and isinstance(block.get("id"), str) and isinstance(block.get("name"), str) \
                and isinstance(block.get("input"), dict):
            calls.append(ToolCall(block["id"], block["name"], block["input"]))
        elif kind != "redacted_thinking":  # only Anthropic's models can read it
            raise ApiError(400, f"'{at}' must be a text, thinking or tool_use {{id, name, input}} block", param=at,
                           code="invalid_value")
    return [Message("assistant", "".join(text), "".join(reasoning), tuple(calls))]


def _stop_reason(result: JobResult) -> str:
    return "tool_use" if result.tool_calls else STOP_REASONS[result.finish_reason]


def _stop_sequence(result: JobResult, stops: tuple[str, ...]) -> str | None:
    """The stop sequence that ended the reply (Anthropic names it); None when something else did."""
    return stops[result.fired_stop] if result.fired_stop is not None and not result.tool_calls else None


def _usage(result: JobResult) -> dict:
    """Anthropic counts the prompt the cache held apart from the rest."""
    return {"input_tokens": result.prompt_tokens - result.cached_tokens, "output_tokens": result.completion_tokens,
            "cache_read_input_tokens": result.cached_tokens, "cache_creation_input_tokens": 0}


def _block(kind: str, text: str) -> dict:
    return {"type": "thinking", "thinking": text, "signature": ""} if kind == REASONING else {"type": "text",
                                                                                              "text": text}


def _tool_use(call: ToolCall, arguments: dict) -> dict:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}


class MessagesReply(PartStream):
    """One reply as a message, whole or as Anthropic's stream events."""

    def __init__(self, model: str, stops: tuple[str, ...]):
        super().__init__()
        self.model, self.stops, self.id = model, stops, "msg_" + secrets.token_hex(12)

    def _message(self, content: list[dict], stop_reason: str | None, usage: dict,
                 stop_sequence: str | None = None) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}

    def whole(self, text: str, result: JobResult) -> dict:
        content = [_block(kind, part) for kind, part in whole_parts(text, result)]
        content += [_tool_use(c, c.arguments) for c in result.tool_calls]
        return self._message(content, _stop_reason(result), _usage(result), _stop_sequence(result, self.stops))

    @staticmethod
    def _event(kind: str, **fields) -> bytes:
        return sse({"type": kind} | fields, kind)

    def opening(self, prompt_tokens: int) -> bytes:
        usage = {"input_tokens": prompt_tokens, "output_tokens": 0}
        return self._event("message_start", message=self._message([], None, usage))

    def piece(self, text: str) -> bytes:
        return self.push(text)

    def opened(self, kind: str, index: int) -> bytes:
        return self._event("content_block_start", index=index, content_block=_block(kind, ""))

    def delta(self, kind: str, index: int, text: str) -> bytes:
        delta = {"type": "thinking_delta", "thinking": text} if kind == REASONING else {"type": "text_delta",
                                                                                        "text": text}
        return self._event("content_block_delta", index=index, delta=delta)

    def closed(self, kind: str, index: int, text: str) -> bytes:
        return self._event("content_block_stop", index=index)

    def calls(self, calls: tuple[ToolCall, ...]) -> bytes:
        frames = self.close()
        for i, call in enumerate(calls, start=len(self.parts)):
            frames += (self._event("content_block_start", index=i, content_block=_tool_use(call, {}))
                       + self._event("content_block_delta", index=i,
                                     delta={"type": "input_json_delta", "partial_json": arguments_json(call)})
                       + self._event("content_block_stop", index=i))
        return frames

    def ending(self, result: JobResult) -> bytes:
        delta = {"stop_reason": _stop_reason(result), "stop_sequence": _stop_sequence(result, self.stops)}
        return (self.close() + self._event("message_delta", delta=delta, usage=_usage(result))
                + self._event("message_stop"))

    def failure(self, error: ApiError) -> bytes:
        return self.close() + sse(error_body(error), "error")

    def closing(self) -> bytes:
        return b""
