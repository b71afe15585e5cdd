"""`fucina chat --think / --thinking-budget` and how the terminal shows reasoning, on a tiny random model
with Qwen3's markers whose template opens the reasoning in the prompt (no starter model reasons)."""

import dataclasses
import json
import io
import sys

from gguf import GGUFValueType as V

from app.cli import main as fucina
from app.cli.reply_printer import ReplyPrinter
from engine.chat.reasoning import Thought
from engine.history.store import HistoryStore
from engine.tokenize import load_tokenizer
from tests.engine.chat.conftest import Script
from tests.engine.chat.reasoning_model import reasoning_metadata
from tests.synthetic import write_tiny_model

# the DeepSeek-R1 distills' template in short: a past reply's reasoning is cut off, and the generation
# prompt opens the reasoning, so the reply starts inside it
R1_LIKE_TEMPLATE = (
    "{%- for m in messages %}{%- if m.role == 'user' %}{{ '<｜User｜>' + m.content }}"
    "{%- elif m.role == 'assistant' %}{{ '<｜Assistant｜>' + m.content.split('</think>')[-1] + '<|im_end|>' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{%- endif %}")


class Stream(io.StringIO):
    def __init__(self, terminal: bool):
        super().__init__()
        self.terminal = terminal

    def isatty(self):
        return self.terminal


def test_a_terminal_shows_reasoning_dimmed_before_the_answer():
    out = Stream(terminal=True)
    show = ReplyPrinter(out, Stream(terminal=True))
    for piece in (Thought("Let me"), Thought(" see."), "Four", "."):
        show(piece)
    assert out.getvalue() == "\x1b[2mThinking: Let me see.\x1b[0m\n\nFour."


def test_a_pipe_keeps_stdout_for_answers():
    out, err = Stream(terminal=False), Stream(terminal=False)
    show = ReplyPrinter(out, err)
    for piece in (Thought("hmm"), "Four."):
        show(piece)
    assert (out.getvalue(), err.getvalue()) == ("Four.", "(thinking) hmm\n")


def write_model(path):
    kinds = {str: V.STRING, bool: V.BOOL, int: V.UINT32, list: V.ARRAY}
    meta = reasoning_metadata() | {"tokenizer.chat_template": R1_LIKE_TEMPLATE}
    write_tiny_model(path, "llama", vocab=len(meta["tokenizer.ggml.tokens"]),
                     metadata={k: (v, kinds[type(v)]) for k, v in meta.items()})
    return path


def test_a_thinking_budget_from_the_command_line_closes_the_reasoning(tmp_path, monkeypatch, capsys):
    import engine.serving.session as session_module

    model = write_model(tmp_path / "thinker.gguf")
    tok = load_tokenizer(reasoning_metadata())
    # the reply scripted (a random model's reply is newlines): the stored chat's options plus the script
    reply = tok.encode("abcdefgh", add_special=False) + [tok.token_id("<|im_end|>")]
    stored_options = session_module.chat_options
    monkeypatch.setattr(session_module, "chat_options",
                        lambda settings: dataclasses.replace(stored_options(settings), processor=Script(reply)))
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\n"))
    assert fucina(["chat", str(model), "--conversation", "new", "--thinking-budget", "3", "--think", "on"]) == 0
    shown = capsys.readouterr()
    # three tokens of reasoning in the prompt's open <think>, then the forced </think> in the place of "d"
    assert shown.err.endswith("(thinking) abc\n") and shown.out == "efgh\n"
    with HistoryStore(tmp_path / "home" / "history.db") as store:
        [conversation] = store.list_conversations()
        assert conversation["sampler"]["thinking_budget"] == 3 and conversation["sampler"]["think"] == "on"
        stored = store.active_branch(conversation["id"])[-1]
    assert (stored["reasoning"], stored["content"], stored["meta"]["reasoning_tokens"]) == ("abc", "efgh", 3)


def test_fucina_conversations_export_import_show_and_search_keep_the_reasoning(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    with HistoryStore(tmp_path / "history.db") as store:
        cid = store.create_conversation("thinker.gguf")
        store.add_message(cid, "user", "Pick a colour")
        store.add_message(cid, "assistant", "Blue.", reasoning="Calm colours suit a question this open.")
    exported = tmp_path / "chat.json"
    assert fucina(["conversations", "export", cid[:8], "--format", "json", "--output", str(exported)]) == 0
    assert fucina(["conversations", "import", str(exported)]) == 0
    copy = capsys.readouterr().out.strip()
    assert fucina(["conversations", "show", copy[:8], "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(m["content"], m["reasoning"]) for m in shown] == [
        ("Pick a colour", ""), ("Blue.", "Calm colours suit a question this open.")]
    assert fucina(["conversations", "search", "suit"]) == 0
    assert capsys.readouterr().out.count("[suit]") == 2  # the reasoning, in the original and the copy
