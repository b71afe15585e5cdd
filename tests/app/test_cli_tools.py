"""`fucina chat --tools FILE`: calls shown and run once allowed (their canned results read back by the model),
declined from a pipe without --allow-tools, the approval prompt's answers, and bad files refused."""

import io
import json
import sys

import pytest

from app.cli import main as fucina
from app.cli.tools import DescribedToolbox, TerminalApproval, describe_call
from engine.tools import ToolCall

MODEL = "smollm2-135m-instruct"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"]}},
    "result": {"temperature_c": 18, "sky": "cloudy"}}]


def chat(monkeypatch, capsys, tmp_path, *flags, tools=TOOLS):
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(tools))
    monkeypatch.setattr(sys, "stdin", io.StringIO("What is the weather in Paris?\n"))
    code = fucina(["chat", MODEL, "--temp", "0", "--max-tokens", "40", "--tools", str(path), *flags])
    return code, capsys.readouterr()


def test_an_allowed_call_runs_and_its_result_is_shown(model_path, monkeypatch, capsys, tmp_path):
    model_path(MODEL)
    code, out = chat(monkeypatch, capsys, tmp_path, "--tool-choice", "required", "--allow-tools")
    assert code == 0, out.err
    assert '[tool call] get_weather({"city": ' in out.err
    assert '[tool result] get_weather: {"temperature_c": 18, "sky": "cloudy"}' in out.err
    assert "tool_call>" not in out.out  # the call is shown once, as the line above, not as the model's markup


def test_a_call_from_a_pipe_is_declined_without_allow_tools(model_path, monkeypatch, capsys, tmp_path):
    model_path(MODEL)
    code, out = chat(monkeypatch, capsys, tmp_path, "--tool-choice", "get_weather")
    assert code == 0 and "[tool call declined" in out.err and "[tool error] get_weather: The user declined" in out.err


@pytest.mark.parametrize("flags, tools, message", [
    (["--tool-choice", "nope"], TOOLS, "tool_choice"),
    ([], [{"type": "function", "function": {"name": "bad name"}}], "tools[0].function.name"),
    (["--conversation", "new"], TOOLS, "--tools and --mcp run an unsaved local chat"),
])
def test_bad_tool_options_are_refused_with_a_reason(monkeypatch, capsys, tmp_path, flags, tools, message):
    with pytest.raises(SystemExit) as stopped:
        chat(monkeypatch, capsys, tmp_path, *flags, tools=tools)
    assert message in str(stopped.value)


def test_the_approval_prompt_takes_yes_no_and_always():
    answers = iter(["maybe", "n", "y", "a"])
    err = io.StringIO()
    approve = TerminalApproval(allow_all=False, interactive=True, ask=lambda prompt: next(answers), err=err)
    call = ToolCall("call_1", "get_weather", {"city": "Oslo"})
    assert approve(call) is False  # "maybe" asked again, then no
    assert approve(call) is True
    assert approve(call) is True and approve.always == {"get_weather"}
    assert approve(call) is True  # always: not asked again (the answers are spent)
    assert err.getvalue().count(describe_call(call)) == 4


def test_a_described_tool_without_a_result_answers_with_an_error(tmp_path):
    path = tmp_path / "tools.json"
    path.write_text(json.dumps([{"type": "function", "function": {"name": "ping"}}]))
    result = DescribedToolbox.from_file(path).run(ToolCall("call_1", "ping", {}))
    assert result.is_error and result.call_id == "call_1" and "only described" in result.content
