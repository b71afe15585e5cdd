"""OpenAI's Responses API (POST /v1/responses) over the server's chat requests.

`input` (a string, or items: messages, function_call and function_call_output, reasoning) and
`instructions` become the chat's messages, `tools` (the flat function shape) and `tool_choice` its tools,
`reasoning.effort` its reasoning effort ("none" closes the reasoning where the template can), `text.format`
(json_object or json_schema) the grammar its answer is held to, as response_format on chat completions. A
reply is a response object whose output items are its reasoning, its message and its function calls, whole
or streamed as the Responses events. Replies are kept (unless `store` is false) in a bounded store so that
`previous_response_id` continues a conversation: its messages are rendered again before the new input, and
the slot that answered it still holds them in its KV cache, so only the new input is prefilled. A kept
reply's response object is also read back (GET /v1/responses/{id}) or forgotten (DELETE).
"""

from __future__ import annotations

import collections
import json
import secrets
import threading
import time
from typing import Any

from app.server_requests import (
    ApiError, Call, Limits, ROLES, boolean, check_tools_and_format, checked_text, content_text, integer,
    model_field, object_field, output_grammar, sampler_of, tool_message, tool_use)
from app.server_stream import REASONING, TEXT, PartStream, arguments_json, sse, whole_parts
from engine.chat import Message
from engine.chat.options import EFFORTS
from engine.sampling.grammar import Grammar
from engine.serving.service import JobResult
from engine.tools import ToolCall

STORED_RESPONSES = 256  # past replies kept for previous_response_id, the least recently used dropped first
TEXT_PARTS = ("input_text", "output_text", "text")
INCOMPLETE = {"length", "length_closed", "context"}  # a reply cut at its token limit or the context's end


class ResponseStore:
    """The last replies by response id: each one's conversation (its messages, the reply included), which
    previous_response_id continues, and its response object, which GET /v1/responses/{id} returns."""

    def __init__(self, size: int = STORED_RESPONSES):
        self.size, self._items = size, collections.OrderedDict()
        self._lock = threading.Lock()  # read on request threads, written on the event loop's

    def _item(self, response_id: str) -> tuple[list[Message], dict] | None:
        with self._lock:
            item = self._items.get(response_id)
            if item is not None:
                self._items.move_to_end(response_id)
            return item

    def get(self, response_id: str) -> list[Message] | None:
        item = self._item(response_id)
        return None if item is None else item[0]

    def response(self, response_id: str) -> dict | None:
        item = self._item(response_id)
        return None if item is None else item[1]

    def put(self, response_id: str, messages: list[Message], response: dict) -> None:
        with self._lock:
            self._items[response_id] = messages, response
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None


def parse_responses(body: dict, limits: Limits, model: str, store: ResponseStore) -> tuple[Call, "ResponsesReply"]:
    """A Responses request as the chat request it asks for, and the writer of its reply."""
    for name in ("background", "conversation", "prompt"):
        if body.get(name):
            raise ApiError(400, f"'{name}' is not supported by this server", param=name, code="unsupported_parameter")
    previous = body.get("previous_response_id")
    history = [] if previous is None else _previous(previous, store)
    conversation = history + _input(body.get("input"), history)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError(400, "'instructions' must be a string", param="instructions", code="invalid_type")
    system = [Message("system", checked_text(instructions, "instructions"))] if instructions else []
    effort = (object_field(body, "reasoning") or {}).get("effort")
    if effort not in (None, "none", *EFFORTS):
        raise ApiError(400, f"'reasoning.effort' must be none, {', '.join(EFFORTS)}, got {effort!r}",
                       param="reasoning.effort", code="invalid_value")
    choice = _choice(body.get("tool_choice"))
    if body.get("tools") is None and choice not in (None, "none", "auto"):
        raise ApiError(400, "'tool_choice' needs 'tools'", param="tool_choice", code="invalid_value")
    tools = None if body.get("tools") is None else tool_use(body["tools"], choice)
    text_format, grammar = _text_format(body)
    check_tools_and_format(tools, grammar, "text.format")
    call = Call(model_field(body), boolean(body, "stream", False), False, system + conversation, None,
                integer(body, "max_output_tokens", 1, limits.max_tokens, limits.max_tokens), sampler_of(body), (),
                grammar, limits.speculation, reasoning_effort=None if effort == "none" else effort, tools=tools,
                think_off=effort == "none")
    echo = {"instructions": instructions, "max_output_tokens": body.get("max_output_tokens"),
            "previous_response_id": previous, "reasoning": {"effort": effort, "summary": None},
            "temperature": call.sampler.temperature, "top_p": call.sampler.top_p,
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "store": boolean(body, "store", True), "metadata": object_field(body, "metadata") or {},
            "text": {"format": text_format}}
    return call, ResponsesReply(model, echo, conversation, store if echo["store"] else None)


def _text_format(body: dict) -> tuple[dict, Grammar | None]:
    """`text.format` (text, json_object, or json_schema with its name, schema and strict flat in it, not
    nested as in chat completions' response_format), and the grammar it holds the reply to."""
    text_format = (object_field(body, "text") or {}).get("format")
    text_format = {"type": "text"} if text_format is None else text_format
    if not isinstance(text_format, dict):
        raise ApiError(400, "'text.format' must be an object", param="text.format", code="invalid_type")
    return text_format, output_grammar(text_format.get("type"), text_format.get("schema"), "text.format",
                                       "text.format.schema")


def _previous(response_id: Any, store: ResponseStore) -> list[Message]:
    messages = store.get(response_id) if isinstance(response_id, str) else None
    if messages is None:
        raise _not_stored(response_id, store, "previous_response_id", "previous_response_not_found")
    return messages


def retrieve(response_id: str, store: ResponseStore) -> dict:
    """GET /v1/responses/{id}: a stored reply's response object, as the request that made it got it."""
    response = store.response(response_id)
    if response is None:
        raise _not_stored(response_id, store, "response_id", "response_not_found")
    return response


def delete(response_id: str, store: ResponseStore) -> dict:
    """DELETE /v1/responses/{id}: the reply is forgotten, so previous_response_id can no longer continue it."""
    if not store.delete(response_id):
        raise _not_stored(response_id, store, "response_id", "response_not_found")
    return {"id": response_id, "object": "response.deleted", "deleted": True}


def _not_stored(response_id: Any, store: ResponseStore, param: str, code: str) -> ApiError:
    return ApiError(404, f"no stored response has the id {response_id!r} (this server keeps the last "
                    f"{store.size}, and none made with store: false)", param=param, code=code)


def _choice(choice: Any) -> str | None:
    """Responses' tool_choice (none, auto, required or {type: function, name}) as a ToolUse choice."""
    if isinstance(choice, dict):
        choice = choice.get("name") if choice.get("type") == "function" else None
        if not isinstance(choice, str):
            raise ApiError(400, "'tool_choice' must be none, auto, required or {type: function, name}",
                           param="tool_choice", code="invalid_value")
    return choice


def _input(items: Any, before: list[Message]) -> list[Message]:
    """`input` as messages: a string is one user message; an assistant's items in a row (its reasoning, its
    message, its function calls) make one assistant message."""
    if isinstance(items, str) and items:
        return [Message("user", checked_text(items, "input"))]
    if not isinstance(items, list) or not items:
        raise ApiError(400, "'input' must be a non-empty string or an array of input items", param="input",
                       code="missing_required_parameter" if items is None else "invalid_type")
    out: list[Message] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and item.get("role") in ROLES and item["role"] != "tool":
            message = Message(ROLES[item["role"]], content_text(item.get("content"), f"{where}.content", TEXT_PARTS))
        elif kind == "function_call":
            message = Message("assistant", "", tool_calls=(_function_call(item, where),))
        elif kind == "reasoning":
            parts = (item.get("content") or []) + (item.get("summary") or [])
            reasoning = content_text(parts, f"{where}.content", ("reasoning_text", "summary_text"))
            message = Message("assistant", "", reasoning)
        elif kind == "function_call_output":
            output = content_text(item.get("output"), f"{where}.output", TEXT_PARTS)
            message = tool_message(item.get("call_id"), Message("tool", output), before + out, f"{where}.call_id")
        else:
            raise ApiError(400, f"'{where}' must be a message (role user, assistant, system or developer), a "
                           "function_call, a function_call_output or a reasoning item", param=where,
                           code="invalid_value")
        if message.role == "assistant" and out and out[-1].role == "assistant":
            last = out.pop()
            message = Message("assistant", last.content + message.content, last.reasoning + message.reasoning,
                              last.tool_calls + message.tool_calls)
        out.append(message)
    return out


def _function_call(item: dict, where: str) -> ToolCall:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not (isinstance(call_id, str) and isinstance(name, str) and isinstance(arguments, str)):
        raise ApiError(400, f"'{where}' must be {{type: function_call, call_id, name, arguments}} with strings",
                       param=where, code="invalid_type")
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ApiError(400, f"'{where}.arguments' must be a JSON object, as a string", param=f"{where}.arguments",
                       code="invalid_value")
    return ToolCall(call_id, name, parsed)


class ResponsesReply(PartStream):
    """One reply as a response object, whole or as the Responses stream's events; kept in the store at its end."""

    def __init__(self, model: str, echo: dict, conversation: list[Message], store: ResponseStore | None):
        super().__init__()
        self.model, self.echo, self.conversation, self.store = model, echo, conversation, store
        self.id, self.created = "resp_" + secrets.token_hex(12), int(time.time())
        self.item_ids: list[str] = []  # by output index: a streamed item keeps its id to the end
        self.sequence = 0

    # -- the response object --

    def _response(self, status: str, output: list[dict], result: JobResult | None = None) -> dict:
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": output, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "parallel_tool_calls": True, "truncation": "disabled",
                "usage": None if result is None else _usage(result)} | self.echo

    def _item_id(self, prefix: str, index: int) -> str:
        self.item_ids += [""] * (index + 1 - len(self.item_ids))
        self.item_ids[index] = self.item_ids[index] or prefix + secrets.token_hex(12)
        return self.item_ids[index]

    def _item(self, kind: str, index: int, text: str, status: str = "completed") -> dict:
        item_id = self._item_id("rs_" if kind == REASONING else "msg_", index)
        if kind == REASONING:
            return {"id": item_id, "type": "reasoning", "summary": [], "status": status,
                    "content": [{"type": "reasoning_text", "text": text}] if status == "completed" else []}
        return {"id": item_id, "type": "message", "role": "assistant", "status": status,
                "content": [_output_text(text)] if status == "completed" else []}

    def _call_item(self, call: ToolCall, index: int, arguments: str, status: str = "completed") -> dict:
        return {"id": self._item_id("fc_", index), "type": "function_call", "call_id": call.id, "name": call.name,
                "arguments": arguments, "status": status}

    def _final(self, parts: list[tuple[str, str]], text: str, result: JobResult) -> dict:
        """The reply's response, kept with its conversation (its reasoning and calls with it)."""
        output = [self._item(kind, i, part) for i, (kind, part) in enumerate(parts)]
        output += [self._call_item(c, len(parts) + i, arguments_json(c)) for i, c in enumerate(result.tool_calls)]
        incomplete = result.finish_reason in INCOMPLETE and not result.tool_calls
        if incomplete:
            output = [item | {"status": "incomplete"} if item["type"] == "message" else item for item in output]
        response = self._response("incomplete" if incomplete else "completed", output, result)
        if self.store is not None:
            reasoning = "".join(part for kind, part in parts if kind == REASONING)
            self.store.put(self.id, self.conversation + [Message("assistant", text, reasoning, result.tool_calls)],
                           response)
        return response

    def whole(self, text: str, result: JobResult) -> dict:
        return self._final(whole_parts(text, result), text, result)

    # -- the stream's events --

    def _event(self, kind: str, **fields) -> bytes:
        self.sequence += 1
        return sse({"type": kind, "sequence_number": self.sequence - 1} | fields, kind)

    def opening(self, prompt_tokens: int) -> bytes:
        snapshot = self._response("in_progress", [])
        return self._event("response.created", response=snapshot) + self._event("response.in_progress",
                                                                                  response=snapshot)

    def piece(self, text: str) -> bytes:
        return self.push(text)

    def opened(self, kind: str, index: int) -> bytes:
        item = self._item(kind, index, "", "in_progress")
        part = _output_text("") if kind == TEXT else {"type": "reasoning_text", "text": ""}
        return self._event("response.output_item.added", output_index=index, item=item) + self._event(
            "response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=part)

    def delta(self, kind: str, index: int, text: str) -> bytes:
        name = "response.output_text.delta" if kind == TEXT else "response.reasoning_text.delta"
        extra = {"logprobs": []} if kind == TEXT else {}
        return self._event(name, item_id=self.item_ids[index], output_index=index, content_index=0, delta=text,
                           **extra)

    def closed(self, kind: str, index: int, text: str) -> bytes:
        item = self._item(kind, index, text)
        name, extra = (("response.output_text.done", {"logprobs": []}) if kind == TEXT
                       else ("response.reasoning_text.done", {}))
        return (self._event(name, item_id=item["id"], output_index=index, content_index=0, text=text, **extra)
                + self._event("response.content_part.done", item_id=item["id"], output_index=index,
                              content_index=0, part=item["content"][0])
                + self._event("response.output_item.done", output_index=index, item=item))

    def calls(self, calls: tuple[ToolCall, ...]) -> bytes:
        frames = self.close()
        for i, call in enumerate(calls, start=len(self.parts)):
            arguments = arguments_json(call)
            item = self._call_item(call, i, "", "in_progress")
            frames += (self._event("response.output_item.added", output_index=i, item=item)
                       + self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                                     delta=arguments)
                       + self._event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                     name=call.name, arguments=arguments)
                       + self._event("response.output_item.done", output_index=i,
                                     item=self._call_item(call, i, arguments)))
        return frames

    def ending(self, result: JobResult) -> bytes:
        frames = self.close()
        text = "".join(part for kind, part in self.parts if kind == TEXT)
        response = self._final(self.parts, text, result)
        return frames + self._event(f"response.{response['status']}", response=response)

    def failure(self, error: ApiError) -> bytes:
        failed = self._response("failed", []) | {"error": {"code": error.code or error.kind, "message": error.message}}
        return self.close() + self._event("response.failed", response=failed)

    def closing(self) -> bytes:
        return b""


def _output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _usage(result: JobResult) -> dict:
    return {"input_tokens": result.prompt_tokens, "input_tokens_details": {"cached_tokens": result.cached_tokens},
            "output_tokens": result.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": result.prompt_tokens + result.completion_tokens}
