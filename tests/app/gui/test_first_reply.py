"""The first reply on a fresh machine: a reply that waits for kernels to compile says so, in the status line
and in its card, with a progress that moves until its first token; and the starter models offered, the one
with the best replies first."""

import re
import sys

import numba
from PySide6.QtCore import Qt

from app.gui.model_picker import ModelPicker
from app.gui.status_line import describe_kernel_wait
from app.gui.worker import EngineStatus
from engine.platform import warmup
from engine.platform.catalog import catalog
from tests.app.gui.conftest import TURN_TIMEOUT_MS
from tests.app.gui.test_chat_flow import GREEDY, wait_idle

WAIT = describe_kernel_wait(0).removesuffix("0%")  # what every kernel wait begins with


def fake_stages(lines: int, every_s: float):
    """A warm-up command whose first-reply stages report `lines` kernels, one every `every_s` seconds, as
    `fucina warmup` does (the real ones take a minute: tests/engine/test_warmup.py runs them)."""
    def command(name, stage):
        report = [warmup.report_line(stage, k) for k in range(1, lines + 1)] if stage in warmup.STAGES else []
        return [sys.executable, "-c",
                f"import time\nfor line in {report!r}:\n    print(line, flush=True)\n    time.sleep({every_s})"]
    return command


def record_waits(monkeypatch, window) -> list[tuple[str, str]]:
    """What the status line and the reply's card say each time the status line changes, from the reply's
    start until its first text."""
    seen = []
    set_text = window.status_line.setText

    def record(text):
        set_text(text)
        if window.streaming and not window.chat_model.last_reply_text():
            seen.append((text, window.chat_view.thinking.text()))

    monkeypatch.setattr(window.status_line, "setText", record)
    return seen


def test_a_first_reply_waits_for_the_warm_up_and_says_so_until_its_first_token(qtbot, open_window, monkeypatch,
                                                                               cold_kernels):
    monkeypatch.setattr(warmup, "command", fake_stages(lines=24, every_s=0.25))
    window = open_window()  # the model is on disk: the warm-up starts with the window, and shows
    bar = window.kernel_warmup.bar
    assert window.kernel_warmup.running and bar.isVisible() and bar.text().startswith("Preparing kernels for your CPU")
    window.apply_settings(GREEDY)
    seen = record_waits(monkeypatch, window)
    window.welcome.prompt_buttons[0].click()  # an example prompt, as a new user's first message
    assert window.streaming and window.current_id is None  # held: the engine has not been asked yet
    wait_idle(qtbot, window)

    held = [(status, card) for status, card in seen if status.startswith(WAIT) and status.endswith("%")]
    assert seen[:len(held)] == held  # the warm-up's progress came first, then the reading
    assert all(card == status for status, card in held)  # the card says it too
    percents = [int(re.fullmatch(r".*, (\d+)%", status)[1]) for status, _ in held]
    assert percents == sorted(percents) and len(set(percents)) >= 4 and percents[-1] == 100
    assert seen[len(held)][1].startswith("thinking")  # the kernels ready, reading began
    assert window.chat_model.last_reply_text() and "first token" in window.status_line.text()
    assert not bar.isVisible()


def test_stopping_a_reply_that_waits_for_the_kernels_gives_its_message_back(qtbot, open_window, monkeypatch,
                                                                           cold_kernels):
    monkeypatch.setattr(warmup, "command", fake_stages(lines=16, every_s=0.25))
    window = open_window()
    window.composer.input.setPlainText("Hello there")
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    assert window.streaming and window.status_line.text().startswith(WAIT)
    window.client.worker.status_changed.emit(EngineStatus(context_size=4096))  # late, from the model's load
    assert window.status_line.text().startswith(WAIT)  # the wait keeps the line; the numbers wait their turn
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Escape)
    assert not window.streaming and window.chat_model.rowCount() == 0
    assert window.composer.input.toPlainText() == "Hello there"
    assert window.status_line.text().startswith("context ")  # the numbers back once the turn ended
    qtbot.waitUntil(lambda: not window.kernel_warmup.running, timeout=TURN_TIMEOUT_MS)
    qtbot.wait(100)
    assert window.store.list_conversations() == [] and not window.streaming  # it never reached the engine


def test_a_kernel_the_reading_compiles_itself_is_said_instead_of_reading(qtbot, open_window, monkeypatch):
    """A model no warm-up prepared (a file of the user's, a new weight format): its first reply compiles."""
    window = open_window()
    window.apply_settings(GREEDY)
    model = window.client.worker.model

    def after_a_compile(step):
        def stepped(tokens, cache):
            numba.njit(lambda x: x + 1)(1)  # a kernel compiled first, as a model's are on its first run
            return step(tokens, cache)
        return stepped

    for name in ("feed", "forward"):  # the prompt's rows without logits, then its last token with them
        monkeypatch.setattr(model, name, after_a_compile(getattr(model, name)))
    seen = record_waits(monkeypatch, window)
    window.composer.input.setPlainText("Hi")
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    wait_idle(qtbot, window)
    waits = [(status, card) for status, card in seen if status.startswith(WAIT)]
    assert len(waits) >= 2  # one for each of the reading's two forwards (the prompt, then its last token)
    assert [status for status, _ in waits] == [describe_kernel_wait(kernel=k) for k in range(1, len(waits) + 1)]
    assert all(card == status for status, card in waits)
    assert window.chat_model.last_reply_text()


def test_the_starters_are_offered_the_best_replies_first_with_their_speed_here(qtbot):
    qwen, smol = catalog()["qwen2.5-coder-0.5b-instruct"], catalog()["smollm2-135m-instruct"]
    picker = ModelPicker([], speeds={qwen.file: 14.2, smol.file: 61.0})
    qtbot.addWidget(picker)
    rows = [picker.starters.item(i).text() for i in range(picker.starters.count())]
    assert rows[0].startswith(f"{qwen.display_name}   (491 MB, ") and rows[0].split("\n")[0].endswith(", 14 tok/s here)")
    assert rows[1].startswith(f"{smol.display_name}   (98 MB, ") and ", 61 tok/s here)" in rows[1]
    assert "slow machines" in rows[1] and "Gemma" in rows[2]
    assert picker.starters.currentRow() == 0
