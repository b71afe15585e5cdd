"""The MCP client against a real server (tests/engine/tools/mcp_test_server.py, on the SDK's own server),
over stdio and Streamable HTTP: what it lists and answers, and every way a server can fail."""

import pytest

from engine.tools import ToolCall
from engine.tools.mcp_client import McpToolbox, qualified_name
from engine.tools.mcp_config import StdioServer
from tests.engine.tools.conftest import stdio_server


@pytest.fixture
def toolbox(request):
    """A toolbox over the given servers (short timeout), closed after the test."""
    made = []

    def make(*servers, timeout=20.0):
        made.append(McpToolbox({s.name: s for s in servers}, timeout=timeout))
        return made[-1]

    yield make
    for box in made:
        box.close()


def call(name, **arguments):
    return ToolCall("call-1", name, arguments)


def test_tool_names_hold_the_server_and_only_function_name_characters():
    assert qualified_name("files", "search") == "files__search"
    assert qualified_name("my-server", "read.file v2") == "my-server__read_file_v2"


def test_stdio_server_lists_its_tools_with_their_schemas_and_answers(toolbox):
    box = toolbox(stdio_server("calc"))
    specs = {s.name: s for s in box.specs()}
    assert set(specs) == {"calc__echo", "calc__add", "calc__fail", "calc__crash", "calc__hang"}
    assert specs["calc__add"].description == "Add two whole numbers."
    assert specs["calc__add"].parameters["properties"]["a"]["type"] == "integer"
    assert specs["calc__add"].parameters["required"] == ["a", "b"]
    result = box.run(call("calc__add", a=2, b=3))
    assert (result.call_id, result.content, result.is_error) == ("call-1", "5", False)
    assert result.seconds > 0


def test_a_call_before_listing_starts_the_server(toolbox):
    assert toolbox(stdio_server()).run(call("test__echo", text="hi")).content == "echo: hi"


def test_two_servers_tools_never_collide(toolbox):
    names = [s.name for s in toolbox(stdio_server("a"), stdio_server("b")).specs()]
    assert len(names) == len(set(names)) == 10


def test_an_error_from_the_tool_is_an_error_result_naming_the_server(toolbox):
    result = toolbox(stdio_server()).run(call("test__fail", reason="the disk is full"))
    assert result.is_error
    assert result.content == ('MCP server "test" reported an error from fail: '
                              "Error executing tool fail: the disk is full")


def test_bad_arguments_are_the_servers_error_result(toolbox):
    result = toolbox(stdio_server()).run(call("test__add", a="x"))
    assert result.is_error and "validation error" in result.content


def test_a_server_that_ends_mid_call_is_an_error_and_the_next_call_starts_it_again(toolbox):
    box = toolbox(stdio_server())
    crashed = box.run(call("test__crash"))
    assert crashed.is_error
    assert crashed.content.startswith('MCP server "test" ended while running crash')
    assert box.run(call("test__echo", text="again")).content == "echo: again"


def test_a_server_that_never_answers_times_out_and_is_started_again(toolbox):
    from dataclasses import replace
    box = toolbox(replace(stdio_server(), timeout=2.0))  # its own timeout, not the toolbox's 20 s
    box.specs()
    hung = box.run(call("test__hang"))
    assert hung.is_error
    assert hung.content == 'MCP server "test" did not answer within 2 s while running hang'
    assert box.run(call("test__echo", text="back")).content == "echo: back"


def test_a_command_that_does_not_exist_is_a_failure_not_a_crash(toolbox):
    box = toolbox(StdioServer("ghost", "no-such-mcp-server-command"), stdio_server())
    assert [s.name for s in box.specs()] == [f"test__{t}" for t in ("echo", "add", "fail", "crash", "hang")]
    assert box.failures["ghost"] == 'MCP server "ghost" could not start (No such file or directory: ' \
                                    'no-such-mcp-server-command)'
    result = box.run(call("ghost__anything"))
    assert result.is_error and result.content == "no MCP tool is called ghost__anything"


def test_a_program_that_is_not_an_mcp_server_says_what_it_wrote(toolbox, tmp_path):
    script = tmp_path / "not_a_server.py"
    script.write_text("import sys\nsys.stderr.write('missing API key\\n')\nsys.exit(1)\n")
    import sys
    box = toolbox(StdioServer("broken", sys.executable, (str(script),)), timeout=10.0)
    assert box.specs() == []
    assert box.failures["broken"].startswith('MCP server "broken" could not start')
    assert box.failures["broken"].endswith("it wrote:\nmissing API key")


def test_a_server_that_never_starts_times_out_and_is_not_waited_for_before_every_reply(toolbox):
    import sys
    import time
    box = toolbox(StdioServer("mute", sys.executable, ("-c", "import time; time.sleep(60)")), timeout=1.0)
    assert box.specs() == []
    assert box.failures["mute"] == 'MCP server "mute" did not start within 1 s'
    start = time.monotonic()
    assert box.specs() == [] and time.monotonic() - start < 0.5  # left out for a while, its failure kept
    assert box.failures["mute"] == 'MCP server "mute" did not start within 1 s'


def test_streamable_http_server_lists_and_answers(toolbox, http_server):
    box = toolbox(http_server)
    assert "web__echo" in {s.name for s in box.specs()}
    assert box.run(call("web__echo", text="over http")).content == "echo: over http"
    assert box.run(call("web__fail", reason="no")).content .endswith("fail: no")


def test_an_http_server_that_is_not_there_is_a_failure(toolbox, http_server):
    from dataclasses import replace
    box = toolbox(replace(http_server, url="http://127.0.0.1:9/mcp"), timeout=10.0)
    assert box.specs() == []
    assert box.failures["web"].startswith('MCP server "web" could not start')


def test_a_program_that_answers_with_what_is_not_mcp_says_what_it_sent(toolbox, tmp_path):
    import sys
    script = tmp_path / "garbage.py"
    script.write_text("import sys\nfor line in sys.stdin:\n    print('<html>not JSON-RPC</html>', flush=True)\n")
    box = toolbox(StdioServer("junk", sys.executable, (str(script),)), timeout=2.0)
    assert box.specs() == []
    assert box.failures["junk"] == 'MCP server "junk" did not start within 2 s; it sent what is not MCP ' \
                                   "(Invalid JSON: expected value at line 1 column 1: '<html>not JSON-RPC</html>')"
