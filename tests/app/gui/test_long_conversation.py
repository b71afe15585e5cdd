"""Scrolling: a 600-message conversation opens quickly (only the newest messages get widgets) and
scrolling up loads older ones without moving what is on screen; a streaming reply is followed at the
bottom, and never moves the view of a reader who scrolled up."""

import time

from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QAbstractSlider

from app.gui.chat_view import RENDER_BATCH
from engine.history.store import HistoryStore
from tests.app.gui.conftest import TURN_TIMEOUT_MS

MESSAGES = 600


def long_conversation(fucina_home) -> str:
    with HistoryStore(HistoryStore.default_path()) as store:
        cid = store.create_conversation("model.gguf", title="Long")
        for i in range(MESSAGES // 2):
            store.add_message(cid, "user", f"Question {i}: what is {i} squared?")
            store.add_message(cid, "assistant", f"**{i}** squared is `{i * i}`.\n\n- one\n- two\n\n```python\nprint({i} ** 2)\n```")
    return cid


def test_a_long_conversation_opens_fast_and_scrolls_back(qtbot, open_window, fucina_home):
    cid = long_conversation(fucina_home)
    window = open_window()
    start = time.perf_counter()
    window.open_conversation(cid)
    qtbot.wait(1)
    opened_ms = (time.perf_counter() - start) * 1e3
    view = window.chat_view
    print(f"\nopening {MESSAGES} messages took {opened_ms:.0f} ms ({len(view.widgets)} widgets built)")
    assert window.chat_model.rowCount() == MESSAGES and len(view.widgets) == RENDER_BATCH
    assert view.widgets[-1].content.startswith(f"**{MESSAGES // 2 - 1}**")

    qtbot.waitUntil(lambda: view.verticalScrollBar().maximum() > 0)
    oldest_shown = view.widgets[0]
    view.verticalScrollBar().triggerAction(QAbstractSlider.SliderAction.SliderToMinimum)
    assert len(view.widgets) == 2 * RENDER_BATCH
    margin = view.widget().layout().contentsMargins().top()
    # the message that was at the top of the view stays there once the older ones are laid out above it
    top = lambda: oldest_shown.mapTo(view.widget(), QPoint(0, 0)).y()  # in the scrolled page, not its column
    qtbot.waitUntil(lambda: top() - view.verticalScrollBar().value() == margin)

    target = window.chat_model.messages[3]["id"]  # far above: scroll_to_message builds a batch around it
    assert view.scroll_to_message(target) is view.widgets[3]


def test_streaming_follows_the_bottom_but_never_moves_a_reader_who_scrolled_up(qtbot, open_window, fucina_home):
    with HistoryStore(HistoryStore.default_path()) as store:
        cid = store.create_conversation("model.gguf", sampler={"temperature": 0.0, "max_tokens": 48})
        for i in range(8):
            store.add_message(cid, "user", f"Say {i}.")
            store.add_message(cid, "assistant", f"{i}.\n\n" + "- a line\n" * 6)
    window = open_window(cid)
    bar = window.chat_view.verticalScrollBar()
    window.composer.input.setPlainText("List ten animals, one per line.")
    window.composer.send_button.click()
    qtbot.waitUntil(lambda: len(window.chat_model.last_reply_text()) > 10, timeout=TURN_TIMEOUT_MS)
    qtbot.waitUntil(lambda: bar.value() == bar.maximum())  # following the reply as it grows
    bar.triggerAction(QAbstractSlider.SliderAction.SliderPageStepSub)  # the reader scrolls up
    reading_at, length = bar.value(), len(window.chat_model.last_reply_text())
    qtbot.waitUntil(lambda: not window.streaming, timeout=TURN_TIMEOUT_MS)
    assert len(window.store.active_branch(cid)[-1]["content"]) > length  # the reply grew meanwhile
    qtbot.wait(50)
    assert bar.value() == reading_at and bar.maximum() > reading_at
