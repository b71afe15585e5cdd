import json

import pytest

from engine.tools.mcp_config import HttpServer, McpConfigError, StdioServer, load_servers, parse_servers


def test_reads_stdio_and_http_servers_as_lm_studio_and_claude_desktop_write_them(tmp_path):
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "files-server"], "env": {"ROOT": "/tmp"}},
        "web": {"url": "http://127.0.0.1:9000/mcp", "headers": {"Authorization": "Bearer x"}, "timeout": 5}}}))
    assert load_servers(path) == {
        "files": StdioServer("files", "npx", ("-y", "files-server"), {"ROOT": "/tmp"}),
        "web": HttpServer("web", "http://127.0.0.1:9000/mcp", {"Authorization": "Bearer x"}, timeout=5)}


def test_empty_text_is_no_servers():
    assert parse_servers("  ") == {}


@pytest.mark.parametrize("text, says", [
    ("{not json", "is not valid JSON: Expecting property name enclosed in double quotes at line 1, column 2"),
    ('{"servers": {}}', 'has no "mcpServers" object'),
    ('{"mcpServers": {"a": {}}}', 'server "a" needs either "command"'),
    ('{"mcpServers": {"a": {"command": "x", "url": "http://h"}}}', 'server "a" needs either "command"'),
    ('{"mcpServers": {"a": {"command": ""}}}', 'server "a": "command" must be a non-empty string'),
    ('{"mcpServers": {"a": {"command": "x", "args": "-v"}}}', 'server "a": "args" must be a list of strings'),
    ('{"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}', 'server "a": "env" must be an object of strings'),
    ('{"mcpServers": {"a": {"url": "ftp://h"}}}', 'server "a": "url" must start with http:// or https://'),
    ('{"mcpServers": {"a b": {"command": "x"}}}', 'server "a b": a server\'s name is made of letters'),
    ('{"mcpServers": {"a": ["x"]}}', 'server "a" is not an object'),
    ('{"mcpServers": {"a": {"command": "x", "timeout": "1"}}}', 'server "a": "timeout" must be a number of seconds'),
    ('{"mcpServers": {"a": {"url": "http://h", "timeout": 0}}}', 'server "a": "timeout" must be a number of seconds'),
])
def test_a_bad_config_says_which_server_and_which_field(text, says):
    with pytest.raises(McpConfigError) as e:
        parse_servers(text, "mcp.json")
    assert str(e.value).startswith("mcp.json")
    assert says in str(e.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(McpConfigError, match="cannot read the MCP servers file .*nope.json"):
        load_servers(tmp_path / "nope.json")
