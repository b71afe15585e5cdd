"""`fucina chat` through a pipe, its slash commands, and `fucina generate --chat` / sampling flags."""

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main as fucina
from tests.golden import golden

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"


def test_chat_answers_through_a_pipe(model_path):
    model_path(MODEL)  # downloaded before the timed part; the command itself uses the default model
    run = subprocess.run([sys.executable, "-m", "app.cli", "chat", "--temp", "0", "--max-tokens", "16"],
                         input="What is the capital of France?\n", capture_output=True, text=True, cwd=REPO,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    assert "Paris" in run.stdout


def chat(monkeypatch, capsys, lines, *flags):
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))
    assert fucina(["chat", MODEL, "--max-tokens", "3", *flags]) == 0
    return capsys.readouterr()


def test_slash_commands(model_path, monkeypatch, capsys):
    model_path(MODEL)
    out = chat(monkeypatch, capsys, ["/stats", "Hi", "/stats", "/system Be brief.", "/reset", "/nope", "/quit",
                                     "never read"], "--temp", "0")
    lines = out.out.splitlines()
    assert lines[0] == "no reply yet"
    assert lines[2].startswith("prompt ") and "ended: length" in lines[2]
    assert len(lines) == 3  # /quit stopped before the last line
    assert "system prompt set" in out.err and "conversation reset" in out.err and "unknown command" in out.err


def prompt_tokens(stats_line):
    return int(stats_line.split()[1])


@pytest.mark.parametrize("stored", [False, True])
def test_system_starts_over(model_path, monkeypatch, capsys, tmp_path, stored):
    model_path(MODEL)
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    flags = ["--temp", "0", *(["--conversation", "new"] if stored else [])]
    fresh = chat(monkeypatch, capsys, ["/system Be brief.", "Hello", "/stats"], *flags).out.splitlines()[-1]
    after = chat(monkeypatch, capsys, ["My name is Zed.", "/system Be brief.", "Hello", "/stats"],
                 *flags)
    last = after.out.splitlines()[-1]
    assert "0 reused" in last and prompt_tokens(last) == prompt_tokens(fresh)  # no earlier turn in the prompt
    assert "system prompt set" in after.err and ("new conversation" in after.err) == stored


def test_a_message_too_long_for_the_context_is_reported_and_the_chat_goes_on(model_path, monkeypatch, capsys):
    model_path(MODEL)
    out = chat(monkeypatch, capsys, ["a message far longer than the eight positions of this context", "/stats"],
               "--ctx", "8")
    assert "context full" in out.err and "/reset" in out.err
    assert out.out.splitlines() == ["no reply yet"]


def test_generate_renders_a_one_turn_chat(model_path, capsys):
    case = golden(MODEL)["greedy"][0]
    assert fucina(["generate", str(model_path(MODEL)), "--chat", "--prompt", case["user"], "--max-tokens", "4",
                   "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["prompt_ids"] == case["prompt_ids"]
    assert result["ids"] == case["greedy_ids"][:4]


def test_generate_samples_reproducibly_with_a_seed(model_path, capsys):
    args = ["generate", str(model_path(MODEL)), "--prompt", "Once upon a time", "--max-tokens", "4", "--json",
            "--temp", "1.2", "--top-k", "50", "--seed", "7"]
    runs = []
    for _ in range(2):
        assert fucina(args) == 0
        runs.append(json.loads(capsys.readouterr().out)["ids"])
    assert runs[0] == runs[1]


def test_generate_chat_needs_text(model_path, capsys):
    assert fucina(["generate", str(model_path(MODEL)), "--chat", "--prompt-ids", "1,2"]) == 2
    assert "--chat" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--top-p=1.5", "--min-p=-1", "--top-k=-3"])
def test_bad_sampler_flags_are_errors(model_path, capsys, flag):
    assert fucina(["generate", str(model_path(MODEL)), "--prompt", "x", flag]) == 2
    assert "error:" in capsys.readouterr().err


def test_a_context_too_large_to_allocate_is_refused_before_loading(capsys):
    with pytest.raises(SystemExit) as exited:
        fucina(["chat", "--ctx", str(10**12)])
    assert exited.value.code == 2 and "--ctx: must be at most 131072, got 1000000000000" in capsys.readouterr().err


def test_generate_spec_prints_the_plain_ids_with_the_decoders_figures(model_path, capsys, tmp_path, monkeypatch):
    from engine.speculative import stream
    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: 1.0 for m in range(1, 18)})
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Repeat exactly: the quick brown fox jumps over the lazy dog.", encoding="utf-8")
    args = ["generate", str(model_path(MODEL)), "--chat", "--prompt-file", str(prompt), "--max-tokens", "24", "--json"]
    assert fucina(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert fucina([*args, "--spec"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert (spec["ids"], spec["text"]) == (plain["ids"], plain["text"]) and plain["spec"] is None
    assert spec["decode_tps"] > 0 and plain["decode_tps"] > 0
    assert spec["spec"]["committed"] == len(spec["ids"]) and 0 <= spec["spec"]["acceptance"] <= 1


def test_chat_spec_reports_the_speculation_in_stats(model_path, monkeypatch, capsys):
    from engine.speculative import stream
    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: 1.0 for m in range(1, 18)})
    model_path(MODEL)
    lines = chat(monkeypatch, capsys, ["Hi", "/stats"], "--temp", "0", "--spec").out.splitlines()
    assert lines[1].startswith("prompt ") and lines[2].startswith("speculation: ")


def test_bench_spec_names_an_unknown_workload(model_path, capsys):
    assert fucina(["bench", str(model_path(MODEL)), "--spec", "--workload", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no workload file or built-in workload 'nope'") and "free_chat" in err


def test_the_terminal_and_the_app_default_to_one_reply_length():
    from app.cli import build_parser
    from app.gui.settings_dialog import DEFAULT_SAMPLER

    args = build_parser().parse_args(["chat"])
    assert args.max_tokens == DEFAULT_SAMPLER["max_tokens"] and args.ctx == DEFAULT_SAMPLER["ctx"]
