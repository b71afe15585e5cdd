"""Every long wait shows progress: the window is driven with synthetic engine events (no model, no timing):
a model load shows a busy bar, an empty reply shows "thinking" until its first text, reading a long prompt
shows tokens read and the time left, and a streaming reply shows its tokens and live speed."""

import threading

import pytest

from app.gui.main_window import MainWindow
from app.gui.status_line import describe_prefill, describe_reply, seconds_left
from app.gui.thinking_indicator import ThinkingIndicator
from app.gui.worker import DecodeRate, EngineStatus, PrefillProgress, ReplyProgress


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))  # no model: nothing loads, nothing downloads
    window = MainWindow(first_run_picker=False)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    return window


def test_reading_a_long_prompt_says_how_far_and_how_long_is_left():
    assert describe_prefill(PrefillProgress(0, 5000)) == "reading prompt 0 / 5,000 tokens"  # no rate yet
    progress = PrefillProgress(1234, 5000, elapsed_s=4.0)
    assert seconds_left(progress) == pytest.approx((5000 - 1234) * 4.0 / 1234)
    assert describe_prefill(progress) == "reading prompt 1,234 / 5,000 tokens  ·  ~12 s left"
    assert describe_prefill(PrefillProgress(500, 50_000, elapsed_s=6.0)).endswith("~10 min left")
    assert describe_prefill(PrefillProgress(5000, 5000, 1, 16.0)) == \
        "context full: 1 oldest turn left out  ·  writing the reply…"


def test_a_streaming_reply_says_its_tokens_and_speed():
    assert describe_reply(ReplyProgress(1)) == "writing the reply: 1 token"
    assert describe_reply(ReplyProgress(1_040, 31.46)) == "writing the reply: 1,040 tokens  ·  31.5 tok/s"


def test_the_live_rate_counts_from_the_first_batch():
    rate = DecodeRate()
    assert rate.progress(3, now=10.0) == ReplyProgress(3, None)  # one batch: no time to measure over yet
    assert rate.progress(3, now=10.0) == ReplyProgress(3, None)
    assert rate.progress(23, now=10.5) == ReplyProgress(23, 40.0)
    assert rate.progress(63, now=11.5) == ReplyProgress(63, 40.0)


def test_a_model_load_shows_a_busy_bar_until_it_ends(qtbot, window):
    worker = window.client.worker
    worker.model_loading.emit("/models/some-model.gguf")
    assert window.load_progress.isVisible() and window.load_progress.maximum() == 0  # busy, not a fraction
    assert window.statusBar().currentMessage() == "Loading some-model.gguf…"
    assert not window.composer.send_button.isEnabled()
    worker.model_loaded.emit("/models/some-model.gguf")
    assert not window.load_progress.isVisible() and window.statusBar().currentMessage() == ""


def test_an_empty_reply_shows_thinking_until_its_first_text_while_the_status_line_counts(qtbot, window):
    worker, view, status = window.client.worker, window.chat_view, window.status_line
    status.show_status(EngineStatus(context_used=20, context_size=4096, ttft_ms=50, decode_tps=12.0))
    window._begin_turn(0, "Summarise this long text")  # what send does before it asks the engine
    turn = window.client.current_turn
    qtbot.waitUntil(view.thinking.isVisible)  # a widget added to a shown one shows with the next event loop
    assert view.thinking.text().startswith("thinking")
    assert window.chat_model.last_reply_text() == ""

    worker.prefill_progress.emit(PrefillProgress(0, 5000), turn)
    assert status.text() == "reading prompt 0 / 5,000 tokens"  # not the last turn's figures
    worker.prefill_progress.emit(PrefillProgress(1234, 5000, 0, 4.0), turn)
    assert status.text() == "reading prompt 1,234 / 5,000 tokens  ·  ~12 s left"
    worker.prefill_progress.emit(PrefillProgress(5000, 5000, 0, 16.0), turn)
    assert status.text() == "writing the reply…" and view.thinking.isVisible()

    worker.reply_text.emit("Once upon", turn)
    worker.reply_progress.emit(ReplyProgress(2), turn)
    assert view.thinking is None and not any(w.isVisible() for w in view.findChildren(ThinkingIndicator))
    assert window.chat_model.last_reply_text() == "Once upon" and status.text() == "writing the reply: 2 tokens"
    worker.reply_progress.emit(ReplyProgress(40, 31.46), turn)
    assert status.text() == "writing the reply: 40 tokens  ·  31.5 tok/s"
    worker.reply_progress.emit(ReplyProgress(99, 1.0), threading.Event())  # an abandoned turn's: ignored
    assert status.text() == "writing the reply: 40 tokens  ·  31.5 tok/s"


def test_a_turn_that_ends_without_text_stops_thinking(qtbot, window):
    window._begin_turn(0, "Hello")
    turn = window.client.current_turn
    indicator = window.chat_view.thinking
    qtbot.waitUntil(indicator.isVisible)
    window.client.worker.turn_finished.emit(None, turn)  # refused before its first token
    assert window.chat_view.thinking is None and not indicator.isVisible()
