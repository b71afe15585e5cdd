"""MCP servers and built-in tools as one toolbox, behind the user's switches."""

from engine.tools import ToolCall, ToolResult, ToolSpec
from engine.tools.builtin import BuiltinToolbox, PickedFile, READ_FILE
from engine.tools.mcp_client import McpToolbox
from engine.tools.toolbox import CombinedToolbox, ToolSwitches
from tests.engine.tools.conftest import stdio_server


class Broken:
    """A toolbox that breaks its promise not to raise."""

    def specs(self):
        return [ToolSpec("broken")]

    def run(self, call):
        raise RuntimeError("bug")


def test_only_switched_on_tools_are_offered_and_run(tmp_path):
    picked = tmp_path / "a.txt"
    picked.write_text("hello")
    reader = PickedFile()
    reader.pick(picked)
    mcp = McpToolbox({"calc": stdio_server("calc")}, timeout=20)
    try:
        box = CombinedToolbox([mcp, BuiltinToolbox([reader])], ToolSwitches(frozenset({"calc__add", READ_FILE})))
        assert [s.name for s in box.specs()] == ["calc__add", READ_FILE]
        assert len(box.all_specs()) == 6
        assert box.run(ToolCall("1", "calc__add", {"a": 1, "b": 1})).content == "2"
        assert box.run(ToolCall("2", READ_FILE, {})).content.endswith("hello")
        off = box.run(ToolCall("3", "calc__echo", {"text": "x"}))
        assert off.is_error and off.content == "the tool calc__echo is switched off"
    finally:
        mcp.close()


def test_a_toolbox_that_raises_gives_an_error_result():
    box = CombinedToolbox([Broken()], ToolSwitches(frozenset({"broken"})))
    result = box.run(ToolCall("1", "broken", {}))
    assert isinstance(result, ToolResult) and result.is_error
    assert result.content == "broken failed: RuntimeError: bug"


def test_switches_round_trip_and_nonsense_is_every_tool_off():
    switches = ToolSwitches().switched("a", True).switched("b", True).allowed_always("a")
    assert switches == ToolSwitches(frozenset({"a", "b"}), frozenset({"a"}))
    assert ToolSwitches.from_json(switches.to_json()) == switches
    assert not switches.needs_approval("a") and switches.needs_approval("b")
    assert switches.switched("b", False).enabled == {"a"}
    assert ToolSwitches.from_json("[1, 2]") == ToolSwitches.from_json(None) == ToolSwitches()
