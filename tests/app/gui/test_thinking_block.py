"""A reply's reasoning in the app: streamed apart from the answer, shown in a "Thinking" block above it (open
while it streams, folded with its duration once the answer starts), stored apart. On a tiny random model
with Qwen3's markers and a scripted reply (no starter model reasons)."""

import dataclasses

import pytest
from PySide6.QtCore import Qt

from app.gui.chat_view import ChatView
from app.gui.message_model import MessageModel
from app.gui.thinking_block import ThinkingBlock, thought_for
from app.gui.worker import TextBatcher
from engine.chat.reasoning import Thought
from tests.app.gui.conftest import TURN_TIMEOUT_MS
from tests.engine.chat.conftest import Script
from tests.engine.chat.reasoning_model import write_reasoning_model

REASONING = "The user greets me. A short, friendly greeting back is best; no need for more."
ANSWER = "Hello! How can I help you today?"


def test_the_batcher_never_joins_reasoning_and_answer():
    sent = []
    batcher = TextBatcher(sent.append, interval=3600)
    for piece in (Thought("a"), Thought("b"), "c", "d"):
        batcher.add(piece)
    batcher.flush()
    # the first piece goes at once; then each kind's run goes whole, its kind kept
    assert [(type(p), p) for p in sent] == [(Thought, "a"), (Thought, "b"), (str, "cd")]


def test_a_streaming_reply_shows_its_reasoning_open_then_folded_with_its_duration(qtbot):
    model = MessageModel(lambda _id: [])
    view = ChatView(model)
    qtbot.addWidget(view)
    view.show()
    model.begin_reply(0, "Hi")
    model.append_reasoning("The user ")
    card = view.widgets[-1]
    block = card.thinking_block
    assert block is not None and block.expanded and block.toggle.text() == "Thinking…"
    assert view.thinking is None  # the block says it thinks: no "thinking..." mark besides it
    model.append_reasoning("greets me.")
    assert card.thinking_block is block and block.text == "The user greets me."
    model.append_reply("Hello!")
    assert not block.expanded and block.toggle.text().startswith("Thought for ")
    assert card.content == "Hello!"
    block.toggle.click()
    assert block.expanded and block.body.isVisibleTo(card)


def test_a_reply_that_calls_a_tool_after_reasoning_folds_it_though_no_answer_text_came(qtbot):
    """A call's markup is not shown as the reply's text, so its start cannot end the thinking block: a
    call asked about (or run) does."""
    model = MessageModel(lambda _id: [])
    view = ChatView(model)
    qtbot.addWidget(view)
    view.show()
    model.begin_reply(0, "What is the weather in Rome?")
    model.append_reasoning("The user wants the weather: call get_weather.")
    block = view.widgets[-1].thinking_block
    assert block.toggle.text() == "Thinking…"
    view.reasoning_ended()
    assert not block.expanded and block.toggle.text().startswith("Thought for ")
    assert view.widgets[-1].content == ""


def test_a_card_built_while_the_reply_reasons_shows_it_live(qtbot):
    model = MessageModel(lambda _id: [])
    model.begin_reply(0, "Hi")
    model.append_reasoning("Still thinking")
    view = ChatView(model)  # built now: the row already holds reasoning
    qtbot.addWidget(view)
    block = view.widgets[-1].thinking_block
    assert block.expanded and block.toggle.text() == "Thinking…"


def test_a_stored_reply_shows_its_reasoning_folded_above_the_answer(qtbot):
    model = MessageModel(lambda _id: [])
    view = ChatView(model)
    qtbot.addWidget(view)
    model.show_branch([{"id": "u", "role": "user", "content": "Hi", "meta": {}, "reasoning": ""},
                       {"id": "a", "role": "assistant", "content": ANSWER, "reasoning": REASONING,
                        "meta": {"reasoning_ms": 3240.0}}])
    user, reply = view.widgets
    assert user.thinking_block is None
    block = reply.thinking_block
    assert block.toggle.text() == "Thought for 3.2 s" and not block.expanded
    assert reply.column.indexOf(block) < reply.column.indexOf(reply.body)  # above the answer


def test_durations_read_naturally():
    assert thought_for(3.24) == "Thought for 3.2 s"
    assert thought_for(125) == "Thought for 2 min"
    assert ThinkingBlock("x").toggle.text() == "Thought"  # a stored reply whose duration is not known


@pytest.fixture
def gui_model(tmp_path_factory):
    return write_reasoning_model(tmp_path_factory.mktemp("think") / "thinker.gguf")


@pytest.fixture
def scripted_reply(monkeypatch):
    """Every chat the app opens replies with the scripted reasoning and answer."""
    import engine.serving.session as session_module
    from engine.tokenize import load_tokenizer
    from tests.engine.chat.reasoning_model import reasoning_metadata

    tok = load_tokenizer(reasoning_metadata())
    reply = tok.encode(f"<think>\n{REASONING}\n</think>\n\n{ANSWER}", add_special=False) + [tok.token_id("<|im_end|>")]
    stored_options = session_module.chat_options
    monkeypatch.setattr(session_module, "chat_options",
                        lambda settings: dataclasses.replace(stored_options(settings), processor=Script(reply)))


def test_a_reply_with_reasoning_through_the_window(qtbot, open_window, scripted_reply):
    window = open_window()
    thoughts = []
    window.client.worker.reply_reasoning.connect(lambda text, _turn: thoughts.append(text))
    window.composer.input.setPlainText("Hi")
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not window.streaming, timeout=TURN_TIMEOUT_MS)
    assert "".join(thoughts) == REASONING  # streamed apart from the answer
    stored = window.store.active_branch(window.current_id)[-1]
    assert (stored["content"], stored["reasoning"]) == (ANSWER, REASONING)
    reply = window.chat_view.widgets[-1]
    assert reply.content == ANSWER and reply.thinking_block.text == REASONING
    assert reply.thinking_block.toggle.text().startswith("Thought for ") and not reply.thinking_block.expanded


def test_the_settings_dialog_edits_a_chats_thinking(qtbot, tmp_path):
    from app.gui.preferences import Preferences
    from app.gui.settings_dialog import SettingsDialog
    from engine.history.validate import check_sampler

    dialog = SettingsDialog({"system_prompt": None, "sampler": {"think": "high", "thinking_budget": 512}},
                            Preferences(tmp_path / "gui.ini"))
    qtbot.addWidget(dialog)
    sampler = dialog.settings()["sampler"]
    assert (sampler["think"], sampler["thinking_budget"]) == ("high", 512)
    assert check_sampler(sampler) == sampler  # what the store takes
    dialog.apply({"system_prompt": None, "sampler": {}})
    assert not {"think", "thinking_budget"} & set(dialog.settings()["sampler"])  # the model's default, no limit
