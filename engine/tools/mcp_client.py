"""MCP servers as a Toolbox, on the official MCP Python SDK (stdio and Streamable HTTP).

A server is started the first time its tools are listed or called, and stopped when the toolbox closes.
The SDK is asyncio: each server lives in a task on the toolbox's private event loop (engine.tools.
event_loop), and specs() / run() block their caller (the engine's worker thread, the command line) until
the server answers or the timeout passes.

Tool names: a server's tool `search` is `<server>__search` in a chat (`files__search` for the server
"files"), so two servers' tools never collide and the built-in tools (whose names hold no `__`) never meet
them; characters a function name may not hold (anything but letters, digits, `_` and `-`) become `_`.

Failure is a result, never an exception or a hang: a server that cannot start, that ends mid-call, that
does not answer within the timeout, or that answers with an error gives an error ToolResult saying which
server and what happened (with the last lines it wrote to stderr, for a subprocess). A server that ended
or did not answer is stopped; the next call starts it again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import tempfile
import time
from contextlib import asynccontextmanager, suppress
from typing import Any

from engine.tools import ToolCall, ToolResult, ToolSpec
from engine.tools.event_loop import LoopThread
from engine.tools.mcp_config import HttpServer, ServerConfig

DEFAULT_TIMEOUT_S = 60.0
SEPARATOR = "__"
_NOT_IN_NAMES = re.compile(r"[^A-Za-z0-9_-]")
_STDERR_TAIL_CHARS = 600
RETRY_START_S = 300.0  # a server that would not start is left out of the lists this long (each try may cost
# the whole timeout, before every reply), then tried again; new settings try it at once
_STOP_WAIT_S = 10.0  # for a server to end its session and its process (the SDK kills it within ~7 s)


def qualified_name(server: str, tool: str) -> str:
    """The tool's name in a chat: `<server>__<tool>`."""
    return _NOT_IN_NAMES.sub("_", f"{server}{SEPARATOR}{tool}")


class ServerFailed(Exception):
    """A server could not start, ended, or did not answer; the message says which and what happened."""


class McpServer:
    """One configured server: started on first use, its connection held by a task on the event loop."""

    def __init__(self, config: ServerConfig, timeout: float):
        self.config, self.timeout = config, config.timeout or timeout
        self._client = None           # the SDK's Client, while connected
        self._session: asyncio.Task | None = None  # holds the connection open until _stop is set
        self._stop: asyncio.Event | None = None
        self._stderr = None           # a subprocess's stderr, kept to say why it failed
        self._not_mcp: str | None = None  # what it sent that is not MCP, since the last request began

    @property
    def name(self) -> str:
        return self.config.name

    async def list_tools(self) -> list:
        client = await self._connected()
        tools, cursor = [], None
        while True:
            page = await self._answer(client.list_tools(cursor=cursor), "listing its tools")
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def call_tool(self, tool: str, arguments: dict[str, Any]):
        client = await self._connected()
        return await self._answer(client.call_tool(tool, arguments), f"running {tool}")

    async def _connected(self):
        """The connected client, starting the server first where it is not running."""
        if self._session is not None and not self._session.done():
            return self._client
        await self.stop()
        from mcp import Client  # the SDK is imported only where a server is configured and used

        ready = asyncio.get_running_loop().create_future()
        self._stop, self._not_mcp = asyncio.Event(), None
        client = Client(self._transport(), message_handler=self._on_message)
        self._session = asyncio.create_task(self._hold(client, ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.timeout)
        except asyncio.TimeoutError:
            ready.cancel()  # nobody waits for it any more
            await self.stop()
            raise ServerFailed(self._failure(f"did not start within {self.timeout:g} s")) from None
        except Exception as e:
            await self.stop()
            raise ServerFailed(self._failure(f"could not start ({_why(e)})")) from None
        return self._client

    async def _hold(self, client, ready: asyncio.Future) -> None:
        try:
            async with client:
                self._client = client
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as e:  # the SDK's task groups raise exception groups, cancellation too
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else ServerFailed("cancelled"))
            if not isinstance(e, Exception):
                raise
        finally:
            self._client = None

    async def _on_message(self, message) -> None:
        """The SDK hands over what the server sent that it could not read as MCP (and notifications)."""
        if isinstance(message, Exception):
            errors = getattr(message, "errors", None)  # pydantic's, for a line that is not JSON-RPC
            first = errors()[0] if callable(errors) and errors() else None
            why = f"{first['msg']}: {first.get('input')!r}" if first else _why(message)
            self._not_mcp = why[:_STDERR_TAIL_CHARS]

    def _transport(self):
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        if isinstance(self.config, HttpServer):
            return _http_transport(self.config.url, self.config.headers)
        self.close_files()
        self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        params = StdioServerParameters(command=self.config.command, args=list(self.config.args), env=self.config.env)
        return stdio_client(params, errlog=self._stderr)

    async def _answer(self, request, doing: str):
        """The server's answer to `request`; a server that ends first, or takes longer than the timeout,
        is stopped and raises ServerFailed."""
        since = self._stderr_size()  # what it writes from here on is about this request
        self._not_mcp = None
        call = asyncio.ensure_future(request)
        done, _ = await asyncio.wait({call, self._session}, timeout=self.timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if call in done and not call.cancelled() and call.exception() is None:
            return call.result()
        call.cancel()
        with suppress(BaseException):
            await call
        if not done:
            what = f"did not answer within {self.timeout:g} s while {doing}"
        elif self._session in done or _connection_closed(call.exception()):
            what = f"ended while {doing}"
        else:
            what = f"failed while {doing} ({_why(call.exception())})"
        await self.stop()
        raise ServerFailed(self._failure(what, since))

    def _failure(self, what: str, since: int = 0) -> str:
        message = f'MCP server "{self.name}" {what}'
        if self._not_mcp:
            message += f"; it sent what is not MCP ({self._not_mcp})"
        tail = self._stderr_tail(since)
        return f"{message}; it wrote:\n{tail}" if tail else message

    def _stderr_size(self) -> int:
        with suppress(OSError, ValueError, AttributeError):
            return self._stderr.seek(0, 2)
        return 0

    def _stderr_tail(self, since: int) -> str:
        """The last of what a subprocess wrote to stderr after `since` (a position in it)."""
        if self._stderr is None:
            return ""
        with suppress(OSError, ValueError):
            self._stderr.seek(since)
            return self._stderr.read()[-_STDERR_TAIL_CHARS:].strip()
        return ""

    async def stop(self) -> None:
        """End the session and the subprocess (a stdio server's); nothing if it is not running."""
        session, self._session = self._session, None
        if session is None:
            return
        if self._client is None:  # still starting: there is no session to end politely
            session.cancel()
        self._stop.set()
        try:
            await asyncio.wait_for(session, _STOP_WAIT_S)
        except BaseException:  # it ended with an error, or would not end: cancelled, which kills the process
            pass

    def close_files(self) -> None:
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


class McpToolbox:
    """The tools of the configured MCP servers: a Toolbox (engine.tools). specs() lists every server's
    tools, starting the servers not running; a server that fails is left out of the list (its failure is
    in `failures`), so the others stay usable, and is not tried again for RETRY_START_S."""

    def __init__(self, servers: dict[str, ServerConfig], timeout: float = DEFAULT_TIMEOUT_S):
        """`timeout`: seconds a server may take to start or to answer, where its config sets none."""
        self._servers = {name: McpServer(config, timeout) for name, config in servers.items()}
        self._routes: dict[str, tuple[McpServer, str]] = {}  # a listed tool's chat name -> server, its own name
        self.failures: dict[str, str] = {}  # server name -> why its tools are not listed
        self._failed_at: dict[str, float] = {}  # server name -> when it last failed to list its tools
        self._loop: LoopThread | None = None

    def specs(self) -> list[ToolSpec]:
        specs = []
        for server in self._servers.values():
            if time.monotonic() - self._failed_at.get(server.name, -RETRY_START_S) < RETRY_START_S:
                continue  # its failure stays in `failures`
            try:
                tools = self._run(server.list_tools())
            except ServerFailed as e:
                self.failures[server.name], self._failed_at[server.name] = str(e), time.monotonic()
                continue
            self.failures.pop(server.name, None)
            for tool in tools:
                name = qualified_name(server.name, tool.name)
                self._routes[name] = (server, tool.name)
                specs.append(ToolSpec(name, tool.description or "", tool.input_schema))
        return specs

    def run(self, call: ToolCall) -> ToolResult:
        start = time.monotonic()
        if call.name not in self._routes:
            self.specs()
        route = self._routes.get(call.name)
        if route is None:
            return _result(call, start, f"no MCP tool is called {call.name}", error=True)
        server, tool = route
        try:
            answer = self._run(server.call_tool(tool, call.arguments))
        except ServerFailed as e:
            return _result(call, start, str(e), error=True)
        text = _text_of(answer)
        if answer.is_error:
            text = f'MCP server "{server.name}" reported an error from {tool}: {text or "(no details)"}'
        return _result(call, start, text, error=bool(answer.is_error))

    def close(self) -> None:
        """Stop every server that was started, and the event loop."""
        if self._loop is None:
            return
        for server in self._servers.values():
            with suppress(Exception):  # one that would not stop is killed with the loop's thread's end
                self._loop.run(server.stop(), timeout=_STOP_WAIT_S * 2)
            server.close_files()
        self._loop.close()
        self._loop = None

    def _run(self, coroutine):
        if self._loop is None:
            self._loop = LoopThread("fucina-mcp")
        # the server enforces the timeout itself (start, then answer, each maybe followed by a stop); this
        # bound only guards against a wedged loop
        try:
            longest = max((server.timeout for server in self._servers.values()), default=0)
            return self._loop.run(coroutine, timeout=2 * (longest + _STOP_WAIT_S) + 5)
        except concurrent.futures.TimeoutError:
            raise ServerFailed("the MCP servers' event loop did not answer") from None


@asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str]):
    """Streamable HTTP with the server's headers, on an HTTP client closed with the connection."""
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    async with create_mcp_http_client(headers) as http, streamable_http_client(url, http_client=http) as streams:
        yield streams


def _result(call: ToolCall, start: float, content: str, *, error: bool = False) -> ToolResult:
    return ToolResult(call.id, content, is_error=error, seconds=time.monotonic() - start)


def _text_of(answer) -> str:
    """A tool's answer as text for the model: its text blocks, a placeholder for what is not text, and
    its structured content when it has no text."""
    parts = []
    for block in answer.content:
        resource = getattr(block, "resource", None)
        if getattr(block, "text", None) is not None:
            parts.append(block.text)
        elif resource is not None and getattr(resource, "text", None) is not None:
            parts.append(resource.text)
        else:
            parts.append(f"[{block.type}: {getattr(block, 'mime_type', None) or getattr(block, 'uri', '')}]")
    if not parts and answer.structured_content is not None:
        parts.append(json.dumps(answer.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def _connection_closed(error: BaseException | None) -> bool:
    """The SDK's error for a connection that closed under a request (a server that ended)."""
    from mcp_types import CONNECTION_CLOSED

    return getattr(error, "code", None) == CONNECTION_CLOSED


def _why(error: BaseException) -> str:
    """An exception in words; an exception group (the SDK's task groups) by its first leaf."""
    while getattr(error, "exceptions", None):
        error = error.exceptions[0]
    if isinstance(error, OSError) and error.strerror:
        return f"{error.strerror}: {error.filename}" if error.filename else error.strerror
    return str(error) or type(error).__name__
