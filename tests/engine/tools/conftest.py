"""An MCP server for the tests (mcp_test_server.py beside this file), over stdio and over Streamable HTTP."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.tools.mcp_config import HttpServer, StdioServer

SERVER_SCRIPT = Path(__file__).with_name("mcp_test_server.py")


def stdio_server(name: str = "test") -> StdioServer:
    return StdioServer(name, sys.executable, (str(SERVER_SCRIPT),))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server():
    """The test server on a free loopback port, over Streamable HTTP; stopped after the test."""
    port = _free_port()
    process = subprocess.Popen([sys.executable, str(SERVER_SCRIPT), "http", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the MCP test server did not start listening")
                time.sleep(0.1)
        yield HttpServer("web", f"http://127.0.0.1:{port}/mcp")
    finally:
        process.terminate()
        process.wait(10)
