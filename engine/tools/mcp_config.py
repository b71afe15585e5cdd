"""The MCP servers a user configured, in the `mcpServers` JSON that LM Studio's mcp.json and Claude
Desktop's config share, so a file made for either is read as it is:

    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "some-mcp-server"], "env": {"KEY": "value"}},
        "web":   {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer …"}}}}

A server with a `command` is started as a subprocess and spoken to over its stdin/stdout; one with a `url`
over Streamable HTTP. Either may say how long it may take to start or to answer a call, `"timeout"` in
seconds (a key of Fucina's, which the other apps ignore); without it the toolbox's default holds. A file that
does not parse, or a server whose fields are wrong, raises McpConfigError naming the server and the field.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import FucinaError

# A tool's name in a chat is `<server>__<tool>` (engine.tools.mcp_client), and function names in the
# OpenAI shape are letters, digits, `_` and `-`: a server's name must be made of those too.
_SERVER_NAME = re.compile(r"[A-Za-z0-9_-]+")


class McpConfigError(FucinaError):
    """An MCP servers file or text that is not JSON, or a server in it whose fields are wrong."""


@dataclass(frozen=True)
class StdioServer:
    """A server the app starts as a subprocess."""
    name: str
    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # over the app's environment
    timeout: float | None = None  # seconds to start or answer a call; None: the toolbox's default


@dataclass(frozen=True)
class HttpServer:
    """A server already running, reached over Streamable HTTP."""
    name: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None


ServerConfig = StdioServer | HttpServer


def parse_servers(text: str, source: str = "the MCP servers settings") -> dict[str, ServerConfig]:
    """The servers of an `mcpServers` JSON text by name, in the order written; `source` names the text
    in errors (the file's path, or the settings). Empty text: no servers."""
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise McpConfigError(f"{source} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        raise McpConfigError(f'{source} has no "mcpServers" object: write {{"mcpServers": {{"name": {{...}}}}}}')
    return {name: _server(name, entry, source) for name, entry in data["mcpServers"].items()}


def load_servers(path: str | os.PathLike) -> dict[str, ServerConfig]:
    """The servers of an `mcpServers` JSON file (an mcp.json, a Claude Desktop config)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise McpConfigError(f"cannot read the MCP servers file {path}: {getattr(e, 'strerror', None) or e}") from None
    return parse_servers(text, str(path))


def _server(name: str, entry, source: str) -> ServerConfig:
    where = f'{source}: server "{name}"'
    if not _SERVER_NAME.fullmatch(name):
        raise McpConfigError(f"{where}: a server's name is made of letters, digits, _ and - only")
    if not isinstance(entry, dict):
        raise McpConfigError(f'{where} is not an object with "command" or "url"')
    if ("command" in entry) == ("url" in entry):
        raise McpConfigError(f'{where} needs either "command" (a program to start) or "url" (a running server)')
    if "url" in entry:
        url = _string(entry, "url", where)
        if not url.startswith(("http://", "https://")):
            raise McpConfigError(f'{where}: "url" must start with http:// or https://, not {url!r}')
        return HttpServer(name, url, _strings(entry, "headers", where), _timeout(entry, where))
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpConfigError(f'{where}: "args" must be a list of strings')
    return StdioServer(name, _string(entry, "command", where), tuple(args), _strings(entry, "env", where),
                       _timeout(entry, where))


def _string(entry: dict, key: str, where: str) -> str:
    value = entry[key]
    if not isinstance(value, str) or not value.strip():
        raise McpConfigError(f'{where}: "{key}" must be a non-empty string')
    return value


def _timeout(entry: dict, where: str) -> float | None:
    value = entry.get("timeout")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
        raise McpConfigError(f'{where}: "timeout" must be a number of seconds above 0')
    return value


def _strings(entry: dict, key: str, where: str) -> dict[str, str]:
    value = entry.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise McpConfigError(f'{where}: "{key}" must be an object of strings')
    return dict(value)
