"""`fucina chat --mcp FILE`: the tools of the MCP servers of an mcpServers file (the test server beside the
tools' tests, over stdio), alone or with --tools; a server that crashes mid-call or never answers is an error
result the chat goes on after, and a bad file is refused with a reason."""

import io
import json
import sys
from argparse import Namespace
from contextlib import ExitStack

import pytest

from app.cli import main as fucina
from app.cli.tools import toolbox_from_args
from tests.app.test_cli_tools import MODEL, TOOLS
from tests.engine.tools.conftest import SERVER_SCRIPT

SERVERS = {"mcpServers": {"calc": {"command": sys.executable, "args": [str(SERVER_SCRIPT)]},
                          "slow": {"command": sys.executable, "args": [str(SERVER_SCRIPT)], "timeout": 3}}}


@pytest.fixture
def mcp_file(tmp_path):
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps(SERVERS))
    return path


def chat(monkeypatch, capsys, mcp_file, tool, text="Echo the word hi."):
    """A one-message chat whose first reply must call `tool`, every call allowed."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(text + "\n"))
    code = fucina(["chat", MODEL, "--temp", "0", "--max-tokens", "64", "--mcp", str(mcp_file),
                   "--tool-choice", tool, "--allow-tools"])
    return code, capsys.readouterr()


def test_an_mcp_tool_is_called_and_its_answer_read_back(model_path, monkeypatch, capsys, mcp_file):
    model_path(MODEL)
    code, out = chat(monkeypatch, capsys, mcp_file, "calc__echo")
    assert code == 0, out.err
    assert "[tool call] calc__echo(" in out.err and "[tool result] calc__echo: echo: " in out.err


@pytest.mark.parametrize("tool, error", [
    ("calc__crash", 'MCP server "calc"'),
    ("slow__hang", 'MCP server "slow" did not answer within 3 s while running hang'),
])
def test_a_server_that_crashes_or_hangs_is_an_error_and_the_chat_goes_on(model_path, monkeypatch, capsys, mcp_file,
                                                                         tool, error):
    model_path(MODEL)
    code, out = chat(monkeypatch, capsys, mcp_file, tool)
    assert code == 0, out.err
    assert f"[tool error] {tool}: {error}" in out.err
    assert out.out.strip()  # the model replied after the error


def test_tools_and_mcp_together_offer_both(tmp_path, mcp_file):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    with ExitStack() as stack:
        toolbox = toolbox_from_args(Namespace(tools=str(tools), mcp=str(mcp_file), tool_choice="auto"), stack)
        names = [spec.name for spec in toolbox.specs()]
    assert names[:2] == ["get_weather", "calc__echo"] and "slow__hang" in names


@pytest.mark.parametrize("text, message", [
    ("{not json", "is not valid JSON"),
    ('{"servers": {}}', 'has no "mcpServers" object'),
])
def test_a_bad_mcp_file_is_refused_with_a_reason(tmp_path, text, message):
    path = tmp_path / "mcp.json"
    path.write_text(text)
    with pytest.raises(SystemExit) as stopped, ExitStack() as stack:
        toolbox_from_args(Namespace(tools=None, mcp=str(path), tool_choice="auto"), stack)
    assert message in str(stopped.value)
