"""Choosing models in the window: a corrupt file is refused with a dialog and the app keeps working on the
model it had; switching models mid-conversation re-renders the history for the new one."""

import threading

from PySide6.QtWidgets import QFileDialog, QMessageBox

from app.gui.worker import EngineWorker
from engine.platform.catalog import catalog
from tests.app.gui.conftest import MODEL, TURN_TIMEOUT_MS
from tests.app.gui.test_chat_flow import GREEDY, send


def error_boxes(window):
    return [box for box in window.findChildren(QMessageBox) if box.isVisible()]


def test_a_corrupt_gguf_shows_an_error_and_the_app_keeps_working(qtbot, open_window, tmp_path, monkeypatch):
    window = open_window()
    loaded = window.model_path
    corrupt = tmp_path / "x.gguf"
    corrupt.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(corrupt), "GGUF models (*.gguf)"))
    picker = window.choose_model()
    picker.open_file()
    qtbot.waitUntil(lambda: bool(error_boxes(window)), timeout=TURN_TIMEOUT_MS)
    [box] = error_boxes(window)
    assert "x.gguf" in box.text() and "Still using SmolLM2" in box.text()
    box.accept()
    assert window.model_path == loaded and window.composer.send_button.isEnabled()
    window.apply_settings(GREEDY)
    send(qtbot, window, "What is the capital of France?")
    assert "Paris" in window.chat_view.widgets[-1].content
    assert str(corrupt) not in window.preferences.recent_models


def test_switching_models_mid_conversation_rerenders_the_history(qtbot, open_window, model_path):
    window = open_window()
    window.apply_settings(GREEDY)
    send(qtbot, window, "Hi!")
    before = [(w.role, w.content) for w in window.chat_view.widgets]
    other = str(model_path("gemma-3-270m"))
    old_status = window.status_line.status
    window.load_model(other)
    qtbot.waitUntil(lambda: window.model_path == other and window.status_line.status is not old_status,
                    timeout=TURN_TIMEOUT_MS)
    assert window.model_path == other and window.model_button.text().startswith("Gemma 3")
    assert window.status_line.status.resumed_positions == 0  # the sidecar held the other model's cache
    send(qtbot, window, "How are you?")
    assert [(w.role, w.content) for w in window.chat_view.widgets][:2] == before
    assert len(window.chat_view.widgets) == 4
    status = window.status_line.status
    assert status.reused_tokens == 0 and status.prefilled_tokens > 10  # the whole history, rendered for Gemma
    assert window.store.get_conversation(window.current_id)["model"] == other


def test_a_starter_model_changed_on_disk_is_refused_before_loading(tmp_path, monkeypatch):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    model = catalog()[MODEL]
    model.path().parent.mkdir(parents=True)
    with open(model.path(), "wb") as f:
        f.truncate(model.size)  # the right size, never verified, not the real bytes
    worker = EngineWorker(tmp_path / "history.db")
    failed = []
    worker.model_failed.connect(lambda path, message: failed.append(message))
    worker.load_model(str(model.path()))  # as a recent model is opened, by its path
    assert len(failed) == 1 and worker.model is None
    assert "has changed since it was downloaded" in failed[0] and f"fucina models pull {MODEL}" in failed[0]


def test_the_picker_shows_a_moe_file_s_parameters_and_refuses_one_this_machine_cannot_hold(qtbot, tmp_path,
                                                                                           monkeypatch):
    from app.gui.model_picker import ModelPicker
    from engine.models import footprint
    from tests.moe_models import write_moe_model

    path = tmp_path / "moe.gguf"
    write_moe_model(path, "q8_0")
    described = footprint.describe(footprint.file_footprint(path))
    read_on = []  # the threads that read a header: never the UI thread (a large vocabulary takes ~0.2 s)
    real_footprint = footprint.file_footprint
    monkeypatch.setattr(footprint, "file_footprint",
                        lambda p: read_on.append(threading.current_thread()) or real_footprint(p))
    picker = ModelPicker([str(path)])
    qtbot.addWidget(picker)
    qtbot.waitUntil(lambda: picker.recent.item(0).text().endswith("\n" + described))
    assert "per token" in described and read_on and threading.main_thread() not in read_on
    monkeypatch.undo()
    chosen, warnings = [], []
    picker.model_chosen.connect(chosen.append)
    monkeypatch.setattr(QMessageBox, "warning", lambda parent, title, text: warnings.append(text))
    monkeypatch.setattr(footprint, "machine_memory", lambda: footprint.RUNTIME_BYTES)
    small = ModelPicker([str(path)])
    qtbot.addWidget(small)
    qtbot.waitUntil(lambda: small.recent.item(0).text().endswith("; too large for this machine's memory"))
    small.choose(str(path))
    assert chosen == [] and "does not fit" in warnings[0] and "moe.gguf" in warnings[0]
    monkeypatch.undo()
    picker.choose(str(path))
    assert chosen == [str(path)]
