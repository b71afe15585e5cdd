"""A remote OpenAI-compatible endpoint as a model source (vLLM on a cluster, llama-server, Ollama, another
Fucina's `fucina serve`): its model list (GET /v1/models) and streamed chat replies (POST
/v1/chat/completions as server-sent events). Every failure is an engine.errors.RemoteError naming the
endpoint and what to check; a stream cut mid-reply keeps the text received (RemoteConnectionLost.partial,
and the reply's turn, which ends "interrupted").

httpx does the HTTP: synchronous, so a reply streams on whatever thread iterates it, like a local one.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.parse
from typing import Iterator, Sequence

import httpx

from engine.chat import Message, TurnResult, TurnStats
from engine.chat.reasoning import Thought
from engine.errors import (RemoteAuthFailed, RemoteConnectionLost, RemoteError, RemoteModelNotFound, RemoteRefused,
                           RemoteTimeout, RemoteUnreachable)

DEFAULT_CONNECT_TIMEOUT_S = 10.0
# a server on CPUs may read a long prompt for minutes before its first token; between tokens this is generous
DEFAULT_READ_TIMEOUT_S = 300.0
INTERRUPTED = "interrupted"  # the finish reason of a reply whose stream was cut (its text is kept)
# OpenAI's finish reasons as a local turn's (engine.chat.TurnResult)
FINISH_REASONS = {"stop": "stop", "length": "length", "content_filter": "stop", "tool_calls": "stop"}


def endpoint_url(url: str) -> str:
    """The API's base URL: http(s)://HOST[:PORT][/PATH]; a URL with no path gets /v1, where every
    OpenAI-compatible server has its API."""
    url = url.strip().rstrip("/")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (parsing it checks it)
    except ValueError as e:
        raise RemoteError(f"the endpoint URL {url!r} is not valid: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError(f"the endpoint URL {url!r} is not http://HOST[:PORT][/v1] or https://HOST[:PORT][/v1]")
    return url if parts.path else f"{url}/v1"


def _server_message(response: httpx.Response) -> str:
    """The error message of an OpenAI-shaped error body, else the start of the body."""
    try:
        body = response.json()
        message = body["error"]["message"] if isinstance(body.get("error"), dict) else body.get("error")
        if message:
            return str(message)
    except (ValueError, AttributeError, KeyError, TypeError):
        pass
    return response.text[:200].strip() or response.reason_phrase


class RemoteClient:
    """One endpoint, its API key and the model its replies come from. `close()` drops its connections."""

    def __init__(self, url: str, api_key: str | None = None, model: str | None = None, *,
                 connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S, read_timeout_s: float = DEFAULT_READ_TIMEOUT_S):
        self.url, self.api_key, self.model = endpoint_url(url), api_key or None, model or None
        self.read_timeout_s = read_timeout_s
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers,
                                  timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s))

    @property
    def name(self) -> str:
        """What a stored conversation records as its model."""
        return f"{self.model or '?'} at {self.url}"

    def close(self) -> None:
        self._http.close()

    def models(self) -> list[str]:
        """The ids the endpoint lists at /v1/models."""
        with self._request("GET", "/models") as response:
            body = self._json(response, "/models")
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
            raise RemoteRefused(f"{self.url}/models did not answer with an OpenAI model list; is this an "
                                "OpenAI-compatible endpoint (its URL usually ends in /v1)?")
        return [m["id"] for m in data]

    def choose_model(self) -> str:
        """The model replies come from: the one asked for when the endpoint lists it, else the first listed."""
        listed = self.models()
        if self.model is None and listed:
            self.model = listed[0]
        elif self.model not in listed:
            raise RemoteModelNotFound(f"{self.url} does not serve the model {self.model!r}; it serves: "
                                      f"{', '.join(listed) or 'no model'}")
        return self.model

    def stream_chat(self, messages: Sequence[Message], params: dict | None = None,
                    cancel: threading.Event | None = None) -> "RemoteReply":
        """A chat reply to stream; `params` are OpenAI request fields (temperature, top_p, seed, max_tokens,
        response_format)."""
        if self.model is None:
            self.choose_model()
        body = {**(params or {}), "model": self.model, "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": m.role, "content": m.content} for m in messages]}
        return RemoteReply(self, body, cancel)

    # -- HTTP -------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _request(self, method: str, path: str, **kwargs) -> Iterator[httpx.Response]:
        """A streamed response whose status is checked; an error status, and a transport failure while it
        is read, are raised as RemoteErrors."""
        try:
            with self._http.stream(method, path, **kwargs) as response:
                if response.status_code >= 400:
                    response.read()
                    raise self._status_error(response, path)
                yield response
        except httpx.HTTPError as e:
            raise self._transport_error(e) from None

    def _json(self, response: httpx.Response, path: str):
        try:
            return json.loads(response.read())
        except ValueError:
            raise RemoteRefused(f"{self.url}{path} did not answer with JSON; is this an OpenAI-compatible "
                                "endpoint (its URL usually ends in /v1)?") from None

    def _transport_error(self, e: httpx.HTTPError) -> RemoteError:
        if isinstance(e, httpx.ConnectTimeout):
            return RemoteUnreachable(f"{self.url} did not accept a connection within the timeout; is the host "
                                     "up and the URL right?")
        if isinstance(e, httpx.ConnectError):
            return RemoteUnreachable(f"cannot connect to {self.url} ({e}); is the server running and the URL "
                                     "right?")
        if isinstance(e, httpx.TimeoutException):
            return RemoteTimeout(f"{self.url} sent nothing for {self.read_timeout_s:g} s; the server may be "
                                 "overloaded")
        if isinstance(e, httpx.UnsupportedProtocol):
            return RemoteError(f"the endpoint URL {self.url!r} is not http:// or https://")
        return RemoteConnectionLost(f"the connection to {self.url} broke ({type(e).__name__}: {e})")

    def _status_error(self, response: httpx.Response, path: str) -> RemoteError:
        status, message = response.status_code, _server_message(response)
        if status in (401, 403):
            advice = "check the API key" if self.api_key else "this endpoint needs an API key"
            return RemoteAuthFailed(f"{self.url} refused the request ({status}: {message}); {advice}")
        if status == 404 and path == "/chat/completions" and "model" in message.lower():
            return RemoteModelNotFound(f"{self.url} does not serve the model {self.model!r} ({message}); "
                                       "choose one it lists")
        if status == 404:
            return RemoteRefused(f"{self.url}{path} does not exist (404: {message}); is this an OpenAI-compatible "
                                 "endpoint (its URL usually ends in /v1)?")
        return RemoteRefused(f"{self.url} refused the request ({status}: {message})")


class RemoteReply:
    """One streamed reply: iterating it yields its text pieces (its reasoning's, where the server sends them
apart as llama-server, vLLM and Fucina do, as Thought); `turn` (a TurnResult) is set once it ends,
    however it ends. Setting `cancel` (or closing the iteration) ends it at the next piece, "cancelled";
    a stream that stops before its end raises RemoteConnectionLost and the turn ends "interrupted", with the
    text received."""

    def __init__(self, client: RemoteClient, body: dict, cancel: threading.Event | None):
        self.client, self.body, self.cancel = client, body, cancel or threading.Event()
        self.turn: TurnResult | None = None
        self.pieces = 0  # content pieces received so far (a server streams about one token each)

    def __iter__(self) -> Iterator[str]:
        started, first = time.perf_counter(), None
        pieces: list[str] = []
        reasoning: list[str] = []
        finish, usage, error = None, {}, None
        try:
            with self.client._request("POST", "/chat/completions", json=self.body) as response:
                for data in _events(response):
                    if self.cancel.is_set():
                        finish = "cancelled"
                        break
                    if data == "[DONE]":
                        finish = finish or "stop"
                        break
                    chunk = self._chunk(data)
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or ():
                        delta = choice.get("delta") if isinstance(choice, dict) else None
                        delta = delta if isinstance(delta, dict) else {}
                        thought = delta.get("reasoning_content") or delta.get("reasoning")  # Ollama: reasoning
                        if isinstance(thought, str) and thought:
                            first = first or time.perf_counter()
                            reasoning.append(thought)
                            yield Thought(thought)
                        text = delta.get("content")
                        if text:
                            first = first or time.perf_counter()
                            pieces.append(text)
                            self.pieces = len(pieces)
                            yield text
                        reason = choice.get("finish_reason") if isinstance(choice, dict) else None
                        finish = FINISH_REASONS.get(reason, reason) if reason else finish
                if finish is None:  # the body ended without its end
                    raise RemoteConnectionLost(f"{self.client.url} closed the connection before the reply ended")
        except GeneratorExit:
            finish = "cancelled"
            raise
        except RemoteError as e:
            error = e if isinstance(e, RemoteConnectionLost) or not pieces else RemoteConnectionLost(str(e))
            raise error from None
        finally:
            text = "".join(pieces)
            if isinstance(error, RemoteConnectionLost):
                error.partial = text
            self.turn = self._turn(text, INTERRUPTED if error and pieces else "error" if error else finish,
                                   usage, started, first, len(pieces), error, "".join(reasoning))

    def _chunk(self, data: str) -> dict:
        try:
            chunk = json.loads(data)
        except ValueError:
            raise RemoteRefused(f"{self.client.url} sent a stream event that is not JSON: {data[:80]!r}") from None
        if not isinstance(chunk, dict):
            raise RemoteRefused(f"{self.client.url} sent a stream event that is not an object: {data[:80]!r}")
        if chunk.get("error"):  # an OpenAI-shaped error sent in the stream
            error = chunk["error"]
            raise RemoteRefused(f"{self.client.url} failed the reply: "
                                f"{error.get('message') if isinstance(error, dict) else error}")
        return chunk

    @staticmethod
    def _turn(text: str, finish: str, usage: dict, started: float, first: float | None, pieces: int,
              error: BaseException | None, reasoning: str) -> TurnResult:
        prompt = int(usage.get("prompt_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        generated = int(usage.get("completion_tokens") or pieces)
        now = time.perf_counter()
        decode_s = now - first if first is not None else 0.0
        stats = TurnStats(prompt_tokens=prompt, reused_tokens=cached, prefilled_tokens=prompt - cached,
                          generated_tokens=generated, ttft_ms=1000 * (first - started) if first else 0.0,
                          decode_tps=(generated - 1) / decode_s if decode_s > 0 and generated > 1 else 0.0)
        return TurnResult(text, [], finish, stats=stats, error=error, reasoning=reasoning)


def _events(response: httpx.Response) -> Iterator[str]:
    """The data of each server-sent event (a multi-line event's lines joined), comments skipped."""
    lines: list[str] = []
    for line in response.iter_lines():
        if not line:
            if lines:
                yield "\n".join(lines)
                lines = []
        elif line.startswith("data:"):
            lines.append(line[5:].removeprefix(" "))
    if lines:
        yield "\n".join(lines)
