"""A conversation that outgrows its context, and a long prompt, in the window (real default model): the
oldest turns are left out and the status line says so, policy stop is a clear message (never a vanished
empty reply), and a long prefill shows its progress and stops on Stop."""

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from engine.history.store import HistoryStore
from tests.app.gui.conftest import TURN_TIMEOUT_MS
from tests.app.gui.test_chat_flow import send, shown, wait_idle

TURNS = 8


def overflowing_conversation(policy: str) -> str:
    """A stored chat of TURNS turns that holds more than its 256-token context."""
    with HistoryStore(HistoryStore.default_path()) as store:
        cid = store.create_conversation("model.gguf", sampler={"temperature": 0.0, "max_tokens": 8, "ctx": 256,
                                                               "context_policy": policy})
        for i in range(TURNS):
            store.add_message(cid, "user", f"Tell me fact number {i} about the sea, in one long sentence.")
            store.add_message(cid, "assistant", f"Fact {i}: the sea covers most of the planet and holds "
                                                f"most of its water, and it is salty.")
    return cid


def test_the_oldest_turns_are_left_out_and_the_status_line_says_so(qtbot, open_window):
    window = open_window(overflowing_conversation("drop_oldest"))
    send(qtbot, window, "And one more?")
    qtbot.waitUntil(lambda: "oldest turns left out" in window.status_line.text())
    reply = window.store.active_branch(window.current_id)[-1]
    assert reply["role"] == "assistant" and reply["content"] and reply["meta"]["left_out_turns"] > 0
    assert len(shown(window)) == 2 * TURNS + 2  # the history keeps (and shows) every turn
    assert f"context full: {reply['meta']['left_out_turns']} oldest turns left out" in window.status_line.text()


def test_policy_stop_says_why_and_keeps_the_message(qtbot, open_window):
    window = open_window(overflowing_conversation("stop"))
    send(qtbot, window, "And one more?")
    qtbot.waitUntil(lambda: any("context policy: stop" in box.text() for box in window.findChildren(QMessageBox)))
    assert shown(window)[-1] == ("user", "And one more?")  # no empty reply box; the message stays


def test_a_long_prompt_shows_its_progress_and_stops_on_stop(qtbot, open_window):
    window = open_window()
    progress = []
    # heard where it is emitted, the engine service's compute thread (queued, it would wait for the turn's end)
    window.client.worker.prefill_progress.connect(lambda p, _turn: progress.append(p),
                                                  Qt.ConnectionType.DirectConnection)
    window.composer.input.setPlainText("Summarize this. " + "The quick brown fox jumps over the lazy dog. " * 200)
    window.composer.send_button.click()
    qtbot.waitUntil(lambda: any(p.done >= 512 for p in progress), timeout=TURN_TIMEOUT_MS)
    total = progress[0].total
    assert total > 1536 and "reading prompt " in window.status_line.text()
    assert progress[0].elapsed_s == 0 < progress[-1].elapsed_s  # the time read so far, for the time left
    window.composer.stop_button.click()
    wait_idle(qtbot, window)
    turn = window.client.worker.session.last_turn
    assert turn.finish_reason == "cancelled" and turn.stats.prefilled_tokens < total
    assert max(p.done for p in progress) < total  # it stopped between slices, before reading everything
    assert "stopped while reading the message" in window.status_line.text()
    assert shown(window)[-1][0] == "user"  # the message is kept; no empty reply is left behind
