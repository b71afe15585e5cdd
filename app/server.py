"""The local OpenAI-compatible server: an ASGI app (Starlette) adapting HTTP to engine.serving.service.

Routes: GET /v1/models; POST /v1/chat/completions and /v1/completions, answered whole or streamed as
server-sent events; POST /v1/responses (OpenAI's Responses API: app.server_responses; GET and DELETE
/v1/responses/{id} read back or forget a stored reply) and /v1/messages (Anthropic's Messages API:
app.server_messages), translated to the same chat requests and told by their own Reply writers; POST
/v1/embeddings (the mean of the model's final hidden states, normalised); GET /v1/fucina/status (the
service's job counts: what a front end shows as the requests served). Replies carry OpenAI's usage, with
prompt_tokens_details.cached_tokens (the prompt the slot's KV cache already held), and a `fucina`
extension field (time to first token, decode speed, the speculative decoder's counts).

Safety: with an API key set, every request needs `Authorization: Bearer KEY` or `x-api-key: KEY` (what
Anthropic's clients send), compared in constant time; bodies are read up to a bound; no CORS headers are
sent, so a web page's scripts cannot read replies; a client that disconnects cancels its job; every
refusal is a JSON error in the endpoint's API's shape (Anthropic's on /v1/messages, OpenAI's elsewhere),
never a traceback.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import os
import secrets
import sys
import time
import traceback
from typing import Callable, Protocol, Sequence

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.concurrency import run_in_threadpool

from app import server_messages, server_responses
from app.server_requests import ApiError, Call, Limits, parse_chat, parse_completion, parse_embeddings, parse_json
from app.server_responses import ResponseStore, parse_responses
from app.server_stream import arguments_json, sse
from engine.chat.reasoning import Thought
from engine.chat.tool_render import tool_format_of
from engine.chat.tool_text import CallTextFilter
from engine.errors import ContextFull, FucinaError
from engine.serving.service import EngineService, Job, JobResult, ServiceBusy, ServiceClosed
from engine.tools import ToolCall

# length_closed: a constrained reply closed to fit its limit, a whole document ("fucina" says which)
FINISH_REASONS = {"stop": "stop", "stop_sequence": "stop", "length": "length", "length_closed": "length",
                  "context": "length", "cancelled": "stop"}


def create_app(service: EngineService, model_ids: Sequence[str], *, api_key: str | None = None,
               limits: Limits = Limits()) -> Starlette:
    """The server's ASGI app over `service`; `model_ids[0]` is the name /v1/models lists, the others are
    accepted as aliases in requests."""
    server = _Server(service, list(model_ids), limits)
    routes = [Route("/v1/models", server.models, methods=["GET"]),
              Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
              Route("/v1/completions", server.completions, methods=["POST"]),
              Route("/v1/responses", server.responses, methods=["POST"]),
              Route("/v1/responses/{response_id}", server.stored_response, methods=["GET", "DELETE"]),
              Route("/v1/messages", server.messages, methods=["POST"]),
              Route("/v1/embeddings", server.embeddings, methods=["POST"]),
              Route("/v1/fucina/status", server.status, methods=["GET"])]
    middleware = [Middleware(_RequireKey, key=api_key)] if api_key else []
    return Starlette(routes=routes, middleware=middleware,
                     exception_handlers={HTTPException: _http_error, Exception: _internal_error})


class _Server:
    def __init__(self, service: EngineService, model_ids: list[str], limits: Limits):
        self.service, self.model_ids, self.limits = service, model_ids, limits
        self.created = int(os.path.getmtime(service.model.file.path))
        self.stored = ResponseStore()  # the Responses API's past replies: previous_response_id, GET by id

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_ids[0], "object": "model", "created": self.created, "owned_by": "fucina"}]})

    async def status(self, request: Request) -> Response:
        return JSONResponse(self.service.status())

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, self._openai(parse_chat, _CHAT))

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, self._openai(parse_completion, _TEXT))

    async def responses(self, request: Request) -> Response:
        return await self._generate(request, lambda body: parse_responses(body, self.limits, self.model_ids[0],
                                                                          self.stored))

    async def stored_response(self, request: Request) -> Response:
        answer = server_responses.delete if request.method == "DELETE" else server_responses.retrieve
        try:
            return JSONResponse(answer(request.path_params["response_id"], self.stored))
        except ApiError as e:
            return _error(e, request)

    async def messages(self, request: Request) -> Response:
        return await self._generate(request, lambda body: server_messages.parse(body, self.limits, self.model_ids[0]))

    def _openai(self, parse: Callable[[dict, Limits], Call], shape: "_Shape"):
        def read(body: dict) -> tuple[Call, _Reply]:
            call = parse(body, self.limits)
            return call, _Reply(shape, self.model_ids[0], call.include_usage)
        return read

    async def embeddings(self, request: Request) -> Response:
        try:
            model, texts, as_base64 = parse_embeddings(parse_json(await _read_body(request, self.limits.max_body)))
            self._check_model(model)
            prompts = await run_in_threadpool(lambda: [self.service.text_prompt(t) for t in texts])
            futures = [self.service.embed(ids) for ids in prompts]
        except ContextFull as e:
            return _error(ApiError(400, str(e), param="input", code="context_length_exceeded"), request)
        except ApiError as e:
            return _error(e, request)
        vectors = [await asyncio.wrap_future(f) for f in futures]
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if as_base64 else v.tolist()}
                for i, v in enumerate(vectors)]
        tokens = sum(map(len, prompts))
        return JSONResponse({"object": "list", "data": data, "model": self.model_ids[0],
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    def _check_model(self, model: str) -> None:
        if model not in self.model_ids:
            raise ApiError(404, f"the model {model!r} does not exist; this server serves {self.model_ids[0]!r}",
                           param="model", code="model_not_found")

    async def _generate(self, request: Request, read: Callable[[dict], tuple[Call, "Reply"]]) -> Response:
        """A chat or completion: `read` turns the body into the request and the reply's writer (its API's)."""
        try:
            body = parse_json(await _read_body(request, self.limits.max_body))
            # a grammar compiles, a template renders: off the event loop
            call, reply, ids = await run_in_threadpool(self._prepare, body, read)
            events: asyncio.Queue = asyncio.Queue()
            job = self._submit(call, ids, events)
        except ApiError as e:
            return _error(e, request)
        if call.stream:
            held = call.tools is not None and call.tools.active
            calls = CallTextFilter(tool_format_of(self.service.template).opener) if held else None
            return _EventStream(job, events, reply, len(ids), calls)
        try:
            text, result = await _collect(job, events, request.receive)
        finally:
            job.cancel()  # the handler was cancelled (the server stops): so is the job; a no-op once it ended
        if result is None:  # the client went away
            return Response(status_code=499)
        if result.finish_reason == "error":
            return _error(_job_error(result), request)
        return JSONResponse(reply.whole(text, result))

    def _prepare(self, body: dict, read) -> tuple[Call, "Reply", list[int]]:
        call, reply = read(body)
        self._check_model(call.model)
        try:
            ids = (self.service.chat_prompt(call.messages, reasoning_effort=call.reasoning_effort, tools=call.tools,
                                            think_off=call.think_off)
                   if call.messages is not None
                   else self.service.text_prompt(call.prompt))
        except FucinaError as e:  # a chat the template cannot render (a trailing assistant message, ...)
            raise ApiError(400, str(e), param="messages", code="invalid_value") from None
        return call, reply, ids

    def _submit(self, call: Call, ids: list[int], events: asyncio.Queue) -> Job:
        loop = asyncio.get_running_loop()
        try:
            return self.service.submit(call.request(ids), lambda e: loop.call_soon_threadsafe(events.put_nowait, e))
        except ContextFull as e:
            raise ApiError(400, str(e), param="messages" if call.messages is not None else "prompt",
                           code="context_length_exceeded") from None
        except (ServiceClosed, ServiceBusy) as e:
            raise ApiError(503, str(e), kind="server_error", code="unavailable") from None


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise _too_large(limit) if declared.isdigit() else ApiError(400, "the Content-Length header is not a number")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than this server takes ({limit} bytes)",
                    code="request_too_large")


async def _until_disconnect(receive) -> None:
    """Return when the client has gone (the body is read by then: receive only waits for the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _next_event(events: asyncio.Queue, gone: asyncio.Future):
    """The job's next event, or None when the client disconnected first."""
    getter = asyncio.ensure_future(events.get())
    done, _ = await asyncio.wait({getter, gone}, return_when=asyncio.FIRST_COMPLETED)
    if getter in done:
        return getter.result()
    getter.cancel()
    return None


async def _collect(job: Job, events: asyncio.Queue, receive) -> tuple[str, JobResult | None]:
    """A whole reply: (text, result); result None when the client disconnected (the job is cancelled)."""
    gone = asyncio.ensure_future(_until_disconnect(receive))
    try:
        while True:
            event = await _next_event(events, gone)
            if event is None:
                return "", None
            if isinstance(event, JobResult):
                return event.text, event
    finally:
        gone.cancel()


class Reply(Protocol):
    """One reply told in an endpoint's API: whole (a JSON body) or streamed (server-sent event frames)."""

    def whole(self, text: str, result: JobResult) -> dict: ...
    def opening(self, prompt_tokens: int) -> bytes: ...
    def piece(self, text: str) -> bytes: ...  # answer text, or reasoning (a Thought)
    def calls(self, calls: tuple[ToolCall, ...]) -> bytes: ...
    def ending(self, result: JobResult) -> bytes: ...
    def failure(self, error: ApiError) -> bytes: ...
    def closing(self) -> bytes: ...


class _EventStream:
    """An ASGI response streaming a job as server-sent events; a client that goes away cancels the job."""

    def __init__(self, job: Job, events: asyncio.Queue, reply: Reply, prompt_tokens: int,
                 calls: "CallTextFilter | None" = None):
        self.job, self.events, self.reply, self.prompt_tokens = job, events, reply, prompt_tokens
        self.calls = calls  # holds back the text of tool calls, which go as the API's call events at the end

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]})
        gone = asyncio.ensure_future(_until_disconnect(receive))
        try:
            await self._send(send, self.reply.opening(self.prompt_tokens))
            while True:
                event = await _next_event(self.events, gone)
                if event is None:
                    return
                if not isinstance(event, JobResult):
                    if self.calls is not None and not isinstance(event, Thought):
                        event = self.calls.push(event)
                    if event:
                        await self._send(send, self.reply.piece(event))
                    continue
                if event.finish_reason == "error":
                    await self._send(send, self.reply.failure(_job_error(event)))
                else:
                    if event.tool_calls:
                        await self._send(send, self.reply.calls(event.tool_calls))
                    elif self.calls is not None and (rest := self.calls.finish()):  # no call after all
                        await self._send(send, self.reply.piece(rest))
                    await self._send(send, self.reply.ending(event))
                break
            await send({"type": "http.response.body", "body": self.reply.closing(), "more_body": False})
        except OSError:  # the connection broke while sending
            return
        finally:
            gone.cancel()
            self.job.cancel()

    @staticmethod
    async def _send(send, frames: bytes) -> None:
        await send({"type": "http.response.body", "body": frames, "more_body": True})


class _Shape:
    """What a reply looks like for one endpoint: its object names and its choice."""

    def __init__(self, whole: str, chunk: str, id_prefix: str, chat: bool):
        self.whole, self.chunk, self.id_prefix, self.chat = whole, chunk, id_prefix, chat

    def choice(self, text: str | None, finish: str | None, *, delta: bool, role: bool = False,
               reasoning: str = "", calls: tuple[ToolCall, ...] = ()) -> dict:
        """A chat's reasoning goes apart from its content (reasoning_content, as llama-server and vLLM send
        it): a streamed reasoning piece (Thought) is a delta of its own. Tool calls go in OpenAI's shape, the
        arguments a JSON string; a streamed call is one delta with the whole call (its index says which)."""
        choice: dict = {"index": 0}
        if not self.chat:
            choice["text"] = text or ""
        elif delta:
            field = "reasoning_content" if isinstance(text, Thought) else "content"
            choice["delta"] = ({"role": "assistant"} if role else {}) | ({} if text is None else {field: text})
            if calls:
                choice["delta"]["tool_calls"] = [{"index": i} | _openai_call(c) for i, c in enumerate(calls)]
        else:
            choice["message"] = {"role": "assistant", "content": text if text or not calls else None} | (
                {"reasoning_content": reasoning} if reasoning else {}) | (
                {"tool_calls": [_openai_call(c) for c in calls]} if calls else {})
        return choice | {"logprobs": None, "finish_reason": finish}


def _openai_call(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": arguments_json(call)}}


def _finish(result: JobResult) -> str:
    return "tool_calls" if result.tool_calls else FINISH_REASONS[result.finish_reason]


_CHAT = _Shape("chat.completion", "chat.completion.chunk", "chatcmpl-", chat=True)
_TEXT = _Shape("text_completion", "text_completion", "cmpl-", chat=False)


class _Reply:
    """The bodies of one chat or completion reply, whole or as chunks sharing one id (`data:` frames)."""

    def __init__(self, shape: _Shape, model: str, include_usage: bool):
        self.shape, self.model, self.include_usage = shape, model, include_usage
        self.id, self.created = shape.id_prefix + secrets.token_hex(12), int(time.time())

    def _body(self, obj: str, choices: list, **extra) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices} | extra

    def _chunk(self, choice: dict | None, **extra) -> bytes:
        return sse(self._body(self.shape.chunk, [] if choice is None else [choice], **extra))

    def whole(self, text: str, result: JobResult) -> dict:
        choice = self.shape.choice(text, _finish(result), delta=False, reasoning=result.reasoning,
                                   calls=result.tool_calls)
        return self._body(self.shape.whole, [choice], usage=_usage(result), fucina=_extension(result))

    def opening(self, prompt_tokens: int) -> bytes:
        return self._chunk(self.shape.choice("", None, delta=True, role=True))

    def piece(self, text: str) -> bytes:
        return self._chunk(self.shape.choice(text, None, delta=True))

    def calls(self, calls: tuple[ToolCall, ...]) -> bytes:
        return self._chunk(self.shape.choice(None, None, delta=True, calls=calls))

    def ending(self, result: JobResult) -> bytes:
        end = self._chunk(self.shape.choice(None, _finish(result), delta=True), fucina=_extension(result))
        return end + (self._chunk(None, usage=_usage(result)) if self.include_usage else b"")

    def failure(self, error: ApiError) -> bytes:
        return sse(error.body())

    def closing(self) -> bytes:
        return b"data: [DONE]\n\n"


def _usage(result: JobResult) -> dict:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": result.cached_tokens}}


def _extension(result: JobResult) -> dict:
    return {"ttft_ms": round(result.ttft_ms, 1), "decode_tps": round(result.decode_tps, 2),
            "speculation": result.speculation, "closed_at_length_limit": result.finish_reason == "length_closed",
            "schema_warnings": list(result.schema_warnings)}


def _job_error(result: JobResult) -> ApiError:
    """A job that failed: a FucinaError is the request's doing (400), anything else the server's (500)."""
    if isinstance(result.error, FucinaError):
        return ApiError(400, str(result.error), code="invalid_request")
    return ApiError(500, "the engine failed while generating this reply (the server log has the details)",
                    kind="server_error", code="engine_error")


def _error(e: ApiError, request: Request) -> JSONResponse:
    return _error_at(e, request.url.path)


def _error_at(e: ApiError, path: str) -> JSONResponse:
    """The error as the API served at `path` shapes its errors."""
    body = server_messages.error_body(e) if path.startswith(server_messages.PATH) else e.body()
    return JSONResponse(body, status_code=e.status)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return _error(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                           code="not_found" if exc.status_code == 404 else None), request)


async def _internal_error(request: Request, exc: Exception) -> Response:
    traceback.print_exception(exc, file=sys.stderr)
    return _error(ApiError(500, "internal server error (the server log has the details)", kind="server_error"),
                  request)


class _RequireKey:
    """ASGI middleware: a request without the server's key, as `Authorization: Bearer KEY` (OpenAI's clients)
    or `x-api-key: KEY` (Anthropic's), is refused (401)."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            scheme, _, token = headers.get("authorization", "").partition(" ")
            token = token if scheme.lower() == "bearer" else ""
            token = token.strip() or headers.get("x-api-key", "").strip()
            refusal = (None if token and hmac.compare_digest(token.encode(), self.key)
                       else ApiError(401, "the API key is not valid", code="invalid_api_key") if token
                       else ApiError(401, "this server needs an API key: send Authorization: Bearer KEY (or "
                                     "x-api-key: KEY)", code="missing_api_key"))
            if refusal is not None:
                return await _error_at(refusal, scope["path"])(scope, receive, send)
        await self.app(scope, receive, send)
