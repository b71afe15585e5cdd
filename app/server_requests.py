"""OpenAI request bodies -> engine service requests, validated: the server's one place that reads input.

A body is refused as OpenAI refuses it: an ApiError with the HTTP status and the error fields (message,
type, param, code) that the server sends as `{"error": {...}}`. Fields the engine cannot honour (n > 1,
logprobs, the legacy `functions`) are refused rather than ignored; fields that only describe the caller
(user, metadata) are ignored. `tools` and `tool_choice` are OpenAI's: the reply's calls come back to the
client, which runs them and sends their results as `tool` messages; the server runs no tool.
"""

from __future__ import annotations

import dataclasses
import json
import math
import secrets
from typing import Any

from engine.chat import Message
from engine.chat.options import EFFORTS
from engine.chat.tool_use import ToolUse, specs_from_openai
from engine.errors import InvalidGrammar
from engine.sampling import CHAT_DEFAULTS, SamplerConfig
from engine.sampling.grammar import Grammar
from engine.serving.service import GenerationRequest
from engine.tools import ToolCall

MAX_STOP_SEQUENCES = 4  # OpenAI's limit
MAX_EMBEDDING_INPUTS = 64  # texts in one embeddings request (each may be a whole context long)
MAX_SEED = 2**63 - 1
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class ApiError(Exception):
    """A request refused with an OpenAI-shaped error."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclasses.dataclass(frozen=True)
class Limits:
    max_body: int = 4 * 2**20   # bytes of one request body
    max_tokens: int = 4096      # the longest reply a request may ask for
    speculation: bool = True    # the default of the `speculation` extension field


@dataclasses.dataclass(frozen=True)
class Call:
    """A parsed generation request: what to answer (messages or prompt) and how."""
    model: str
    stream: bool
    include_usage: bool
    messages: list[Message] | None  # chat completions
    prompt: str | None              # completions
    max_tokens: int
    sampler: SamplerConfig
    stop: tuple[str, ...]
    grammar: Grammar | None
    speculation: bool
    reasoning_effort: str | None = None  # how hard a reasoning model thinks, where its template reads it
    tools: ToolUse | None = None  # the tools a chat's reply may call
    think_off: bool = False  # the prompt closes the reasoning, where the template can
    thinking_budget: int | None = None  # reasoning tokens before the reasoning is closed

    def request(self, ids: list[int]) -> GenerationRequest:
        # a chat's reply comes with its reasoning apart; a completion continues the raw text
        return GenerationRequest(tuple(ids), self.max_tokens, self.sampler, self.stop, self.grammar,
                                 self.speculation, split_reasoning=self.messages is not None, tools=self.tools,
                                 thinking_budget=self.thinking_budget)


def parse_json(body: bytes) -> dict:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
        raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {json_type(value)}", code="invalid_json")
    return value


def parse_chat(body: dict, limits: Limits) -> Call:
    call = _call(body, limits, messages=_messages(body), prompt=None)
    tools = _tools(body)
    check_tools_and_format(tools, call.grammar, "response_format")
    return dataclasses.replace(call, tools=tools)


def check_tools_and_format(tools: ToolUse | None, grammar: Grammar | None, param: str) -> None:
    """Active tools and a structured output (`param` names its field) exclude each other."""
    if tools is not None and tools.active and grammar is not None:
        raise ApiError(400, f"'tools' and '{param}' cannot be combined: a tool call has its own format",
                       param=param, code="invalid_value")


def parse_completion(body: dict, limits: Limits) -> Call:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "'prompt' must be a non-empty string (one prompt per request)", param="prompt",
                       code="invalid_type" if prompt is not None else "missing_required_parameter")
    if body.get("suffix") is not None or body.get("echo"):
        raise ApiError(400, "'suffix' and 'echo' are not supported", param="suffix" if body.get("suffix") else "echo")
    return _call(body, limits, messages=None, prompt=checked_text(prompt, "prompt"))


def parse_embeddings(body: dict) -> tuple[str, list[str], bool]:
    """(model, the texts to embed, whether the vectors go as base64 float32 rather than JSON arrays)."""
    model = model_field(body)
    texts = body.get("input")
    texts = [texts] if isinstance(texts, str) else texts
    if (not isinstance(texts, list) or not 1 <= len(texts) <= MAX_EMBEDDING_INPUTS
            or not all(isinstance(t, str) and t for t in texts)):
        raise ApiError(400, f"'input' must be a non-empty string or an array of 1 to {MAX_EMBEDDING_INPUTS} of them "
                       "(token arrays are not taken)", param="input",
                       code="missing_required_parameter" if texts is None else "invalid_type")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise ApiError(400, "'encoding_format' must be float or base64", param="encoding_format", code="invalid_value")
    if body.get("dimensions") is not None:
        raise ApiError(400, "'dimensions' is not supported: the vectors have the model's width",
                       param="dimensions", code="unsupported_parameter")
    return model, [checked_text(t, "input") for t in texts], encoding == "base64"


def model_field(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' must name the served model (GET /v1/models lists it)", param="model",
                       code="missing_required_parameter" if model is None else "invalid_type")
    return model


def _call(body: dict, limits: Limits, *, messages, prompt) -> Call:
    model = model_field(body)
    if integer(body, "n", 1, 1 << 31, 1) != 1:
        raise ApiError(400, "only n=1 is supported", param="n", code="unsupported_value")
    for name in ("logprobs", "functions", "function_call") + (() if messages is not None else ("tools", "tool_choice")):
        if body.get(name):
            raise ApiError(400, f"'{name}' is not supported by this server", param=name, code="unsupported_parameter")
    stream = boolean(body, "stream", False)
    options = object_field(body, "stream_options") or {}
    include_usage = boolean(options, "include_usage", False, label="stream_options.include_usage")
    max_tokens = integer(body, "max_completion_tokens", 1, limits.max_tokens, None)
    if max_tokens is None:
        max_tokens = integer(body, "max_tokens", 1, limits.max_tokens, limits.max_tokens)
    sampler = sampler_of(body, presence_penalty=number(body, "presence_penalty", -2.0, 2.0, 0.0),
                         freq_penalty=number(body, "frequency_penalty", -2.0, 2.0, 0.0))
    return Call(model, stream, include_usage, messages, prompt, max_tokens, sampler, _stop(body),
                _response_format(body), boolean(body, "speculation", limits.speculation),
                _reasoning_effort(body))


def sampler_of(body: dict, *, max_temperature: float = 2.0, **fields) -> SamplerConfig:
    """The chat defaults with the body's temperature, top_p and seed (a fresh seed where it names none)."""
    seed = integer(body, "seed", 0, MAX_SEED, None)
    return dataclasses.replace(
        CHAT_DEFAULTS, temperature=number(body, "temperature", 0.0, max_temperature, CHAT_DEFAULTS.temperature),
        top_p=number(body, "top_p", 0.0, 1.0, CHAT_DEFAULTS.top_p),
        seed=secrets.randbits(63) if seed is None else seed, **fields)


def _reasoning_effort(body: dict) -> str | None:
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in EFFORTS:
        raise ApiError(400, f"'reasoning_effort' must be one of {', '.join(EFFORTS)}, got {effort!r}",
                       param="reasoning_effort", code="invalid_value")
    return effort


def _messages(body: dict) -> list[Message]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty array of {role, content} objects", param="messages",
                       code="missing_required_parameter" if messages is None else "invalid_type")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"'{where}' must be an object", param=where, code="invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise ApiError(400, f"'{where}.role' must be one of {', '.join(ROLES)}, got {role!r}",
                           param=f"{where}.role", code="invalid_value")
        reasoning = m.get("reasoning_content")  # a past reply's reasoning, as this server returns it
        if reasoning is not None and (role != "assistant" or not isinstance(reasoning, str)):
            raise ApiError(400, f"'{where}.reasoning_content' must be a string, on an assistant message",
                           param=f"{where}.reasoning_content", code="invalid_value")
        calls = _tool_calls(m.get("tool_calls"), role, where)
        content = m.get("content")
        if content is None and calls:  # an assistant reply that only called tools
            content = ""
        message = Message(ROLES[role], content_text(content, f"{where}.content"),
                          checked_text(reasoning or "", f"{where}.reasoning_content"), calls)
        if role == "tool":
            message = tool_message(m.get("tool_call_id"), message, out, f"{where}.tool_call_id")
        out.append(message)
    return out


def _tool_calls(calls: Any, role: str, where: str) -> tuple[ToolCall, ...]:
    """An assistant message's tool_calls, OpenAI's shape: [{id, type: function, function: {name, arguments}}],
    the arguments a JSON object written as a string."""
    if calls is None:
        return ()
    param = f"{where}.tool_calls"
    if role != "assistant" or not isinstance(calls, list):
        raise ApiError(400, f"'{param}' must be an array, on an assistant message", param=param, code="invalid_value")
    out = []
    for j, c in enumerate(calls):
        function = c.get("function") if isinstance(c, dict) else None
        if (not isinstance(function, dict) or not isinstance(c.get("id"), str)
                or not isinstance(function.get("name"), str) or not isinstance(function.get("arguments"), str)):
            raise ApiError(400, f"'{param}[{j}]' must be {{id, type: function, function: {{name, arguments}}}} with "
                           "string id, name and arguments", param=f"{param}[{j}]", code="invalid_type")
        try:
            arguments = json.loads(function["arguments"]) if function["arguments"].strip() else {}
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise ApiError(400, f"'{param}[{j}].function.arguments' must be a JSON object, as a string",
                           param=f"{param}[{j}].function.arguments", code="invalid_value")
        out.append(ToolCall(c["id"], function["name"], arguments))
    return tuple(out)


def tool_message(call_id: Any, message: Message, before: list[Message], param: str) -> Message:
    """A tool result: it names the call it answers (`param` says where), one of an earlier assistant message's."""
    calls = {c.id: c.name for earlier in before for c in earlier.tool_calls}
    if not isinstance(call_id, str) or call_id not in calls:
        raise ApiError(400, f"'{param}' must name a tool call of an earlier assistant message",
                       param=param, code="invalid_value")
    return dataclasses.replace(message, tool_call_id=call_id, name=calls[call_id])


def _tools(body: dict) -> ToolUse | None:
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none", "auto"):
            raise ApiError(400, "'tool_choice' needs 'tools'", param="tool_choice", code="invalid_value")
        return None
    if isinstance(choice, dict):
        function = choice.get("function") if choice.get("type") == "function" else None
        choice = function.get("name") if isinstance(function, dict) else None
        if not isinstance(choice, str):
            raise ApiError(400, "'tool_choice' must be none, auto, required or {type: function, function: {name}}",
                           param="tool_choice", code="invalid_value")
    return tool_use(tools, choice)


def tool_use(tools: Any, choice: str | None) -> ToolUse:
    """OpenAI's function tools (either shape: engine.chat.tool_use) and a choice among them (a tool's name)."""
    try:
        specs = specs_from_openai(tools)
    except ValueError as e:
        raise ApiError(400, f"'tools': {e}", param="tools", code="invalid_value") from None
    try:
        return ToolUse(specs, "auto" if choice is None else choice)
    except ValueError as e:
        raise ApiError(400, f"'tool_choice': {e}", param="tool_choice", code="invalid_value") from None


def content_text(content: Any, where: str, kinds: tuple[str, ...] = ("text",)) -> str:
    """A message's text: a string, or an array of text parts (of the `kinds` types, joined)."""
    if isinstance(content, str):
        return checked_text(content, where)
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in kinds
                                         and isinstance(p.get("text"), str) for p in content):
        return checked_text("".join(p["text"] for p in content), where)
    raise ApiError(400, f"'{where}' must be a string or an array of text parts ({{type: {'|'.join(kinds)}, text}})",
                   param=where, code="invalid_type")


def checked_text(text: str, where: str) -> str:
    """`text`, which must be encodable: JSON may spell a lone UTF-16 surrogate ("\\ud800"), UTF-8 cannot."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"'{where}' holds a lone surrogate (\\ud800-\\udfff), which is not text",
                       param=where, code="invalid_value") from None
    return text


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (not isinstance(stops, list) or not 1 <= len(stops) <= MAX_STOP_SEQUENCES
            or not all(isinstance(s, str) and s for s in stops)):
        raise ApiError(400, f"'stop' must be a non-empty string or an array of 1 to {MAX_STOP_SEQUENCES} of them",
                       param="stop", code="invalid_type")
    return tuple(checked_text(s, "stop") for s in stops)


def _response_format(body: dict) -> Grammar | None:
    rf = object_field(body, "response_format")
    if rf is None:
        return None
    spec = rf.get("json_schema") if rf.get("type") == "json_schema" else {}
    if not isinstance(spec, dict):
        raise ApiError(400, "'response_format.json_schema' must be an object whose 'schema' is a JSON schema object",
                       param="response_format.json_schema", code="invalid_type")
    return output_grammar(rf.get("type"), spec.get("schema", {}), "response_format",
                          "response_format.json_schema.schema")


def output_grammar(kind: Any, schema: Any, param: str, schema_param: str) -> Grammar | None:
    """The grammar a structured output asks for: none for text, any JSON object for json_object, the
    `schema`'s documents for json_schema. Chat completions' response_format and Responses' text.format
    hold these fields in different places: `param` and `schema_param` name them in errors."""
    if kind == "text":
        return None
    if kind == "json_schema" and not isinstance(schema, dict):
        raise ApiError(400, f"'{schema_param}' must be a JSON schema object", param=schema_param,
                       code="invalid_type")
    try:
        if kind == "json_object":
            return Grammar.json_object()
        if kind == "json_schema":
            return Grammar("json_schema", json.dumps(schema))
    except InvalidGrammar as e:
        raise ApiError(400, f"'{param}': {e}", param=param, code="invalid_value") from None
    raise ApiError(400, f"'{param}.type' must be text, json_object or json_schema", param=f"{param}.type",
                   code="invalid_value")


# -- typed fields: a wrong type or a value out of range names the field --

def object_field(body: dict, name: str) -> dict | None:
    value = body.get(name)
    if value is not None and not isinstance(value, dict):
        raise ApiError(400, f"'{name}' must be an object, got {json_type(value)}", param=name, code="invalid_type")
    return value


def boolean(body: dict, name: str, default: bool, *, label: str | None = None) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        label = label or name
        raise ApiError(400, f"'{label}' must be a boolean, got {json_type(value)}", param=label,
                       code="invalid_type")
    return value


def integer(body: dict, name: str, lo: int, hi: int, default):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be an integer, got {json_type(value)}", param=name, code="invalid_type")
    if not lo <= value <= hi:
        raise ApiError(400, f"'{name}' must be between {lo} and {hi}, got {value}", param=name, code="invalid_value")
    return value


def number(body: dict, name: str, lo: float, hi: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be a number, got {json_type(value)}", param=name, code="invalid_type")
    if not (math.isfinite(value) and lo <= value <= hi):
        raise ApiError(400, f"'{name}' must be between {lo:g} and {hi:g}, got {value}", param=name,
                       code="invalid_value")
    return float(value)


def json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
