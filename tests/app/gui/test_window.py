"""The window around the chat: shortcuts, the sidebar's rename / pin / delete, export and import, the first
start without a model, and `fucina --screenshot`."""

import json
import subprocess
import sys
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QGuiApplication, QImage
from PySide6.QtWidgets import QFileDialog, QMessageBox

from app.gui.conversation_list import GROUP_ROLE
from app.gui.main_window import MainWindow
from app.gui.model_picker import ModelPicker
from engine.platform.catalog import catalog
from tests.app.gui.conftest import TURN_TIMEOUT_MS
from tests.app.gui.test_chat_flow import GREEDY, send

REPO = Path(__file__).resolve().parents[3]


def sidebar_titles(window):
    """The sidebar's rows as shown: each group's heading, then its conversations."""
    model, shown, group = window.sidebar.list.model(), [], None
    for row in range(model.rowCount()):
        index = model.index(row)
        if index.data(GROUP_ROLE) != group:
            group = index.data(GROUP_ROLE)
            shown.append(group)
        shown.append(index.data())
    return shown


def test_shortcuts_sidebar_and_export_import(qtbot, open_window, tmp_path, monkeypatch):
    window = open_window()
    window.apply_settings(GREEDY)
    send(qtbot, window, "Hello there")
    first = window.current_id
    qtbot.keyClick(window, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert QGuiApplication.clipboard().text() == window.chat_view.widgets[-1].content

    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.current_id is None and window.chat_view.widgets == []
    assert window.current_settings() == {}  # a new chat starts on the defaults
    window.apply_settings(GREEDY)
    send(qtbot, window, "Second chat")
    second = window.current_id
    assert second != first and sidebar_titles(window) == ["Today", "Second chat", "Hello there"]

    window.sidebar.set_pinned(first, True)
    assert sidebar_titles(window) == ["Pinned", "Hello there", "Today", "Second chat"]
    model = window.sidebar.list.model()
    assert model.setData(model.index(0), "Greetings")  # what an in-place rename ends with
    assert window.store.get_conversation(first)["title"] == "Greetings"

    exported = tmp_path / "greetings.json"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(exported), "JSON (*.json)"))
    window.export_conversation(first)
    assert json.loads(exported.read_text())["conversation"]["title"] == "Greetings"
    markdown = tmp_path / "greetings.md"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(markdown), "Markdown (*.md)"))
    window.export_conversation(first)
    assert markdown.read_text().startswith("# Greetings")

    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    window.sidebar.confirm_delete(first)
    qtbot.waitUntil(lambda: "Greetings" not in sidebar_titles(window))
    assert window.current_id == second

    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(exported), "JSON (*.json)"))
    window.import_conversation()
    assert window.current_id not in (first, second)
    assert [w.content for w in window.chat_view.widgets][0] == "Hello there"
    assert "Greetings" in sidebar_titles(window)


class FakeDownload(QObject):
    """Stands in for the download thread: no network in tests."""
    progress, done, failed, cancelled, finished = (Signal(object, object, str), Signal(str), Signal(str),
                                                   Signal(), Signal())
    started = []

    def __init__(self, name):
        super().__init__()
        self.name = name

    def start(self):
        FakeDownload.started.append(self.name)
        self.progress.emit(25, 100, "downloading")

    def cancel(self):
        self.cancelled.emit()
        self.finished.emit()

    def wait(self):
        pass


def test_first_start_downloads_the_starter_with_the_best_replies_and_a_cancel_offers_the_others(
        qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))  # no models, no preferences
    monkeypatch.setattr("app.gui.model_picker.Download", FakeDownload)
    monkeypatch.setattr(FakeDownload, "started", [])
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    [picker] = window.findChildren(ModelPicker)
    assert picker.isVisible()
    rows = [picker.starters.item(i).text() for i in range(picker.starters.count())]
    assert rows[0].startswith("Qwen2.5 Coder 0.5B Instruct (Q4_K_M)   (491 MB, not downloaded)")
    assert "best replies" in rows[0]
    assert rows[1].startswith("SmolLM2 135M Instruct (Q4_1)   (98 MB, not downloaded)") and "slow machines" in rows[1]
    assert picker.starters.currentRow() == 0
    qtbot.waitUntil(lambda: FakeDownload.started == ["qwen2.5-coder-0.5b-instruct"])
    assert picker.progress.isVisible() and picker.progress.value() == 250
    qtbot.mouseClick(picker.cancel_button, Qt.MouseButton.LeftButton)
    assert not picker.progress.isVisible() and picker.use_button.isEnabled()
    assert picker.use_button.text() == "Download and use"
    assert not window.composer.send_button.isEnabled()
    picker.starters.setCurrentRow(1)  # the small one, for a slow machine
    qtbot.mouseClick(picker.use_button, Qt.MouseButton.LeftButton)
    assert FakeDownload.started == ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]


def test_screenshot_command_renders_the_window(fucina_home, tmp_path):
    png = tmp_path / "shot.png"
    run = subprocess.run([sys.executable, "-m", "app.cli", "--screenshot", str(png)], cwd=REPO,
                         capture_output=True, text=True, timeout=TURN_TIMEOUT_MS / 1000)
    assert run.returncode == 0, run.stderr
    image = QImage(str(png))
    assert (image.width(), image.height()) == (1100, 720)


def test_screenshot_without_a_model_downloads_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path / "home"))
    png = tmp_path / "shot.png"
    run = subprocess.run([sys.executable, "-m", "app.cli", "--screenshot", str(png)], cwd=REPO,
                         capture_output=True, text=True, timeout=TURN_TIMEOUT_MS / 1000)
    assert run.returncode == 0, run.stderr
    assert QImage(str(png)).width() == 1100
    assert not (tmp_path / "home" / "models").exists()


def test_every_control_has_an_accessible_name(qtbot, open_window):
    from PySide6.QtWidgets import QAbstractButton, QAbstractItemView, QLineEdit, QPlainTextEdit

    window = open_window()
    window.apply_settings(GREEDY)
    send(qtbot, window, "Hi")
    controls = [w for kind in (QAbstractButton, QLineEdit, QPlainTextEdit, QAbstractItemView)
                for w in window.findChildren(kind) if w.isVisible()]
    assert len(controls) > 10
    unnamed = [w for w in controls if not (w.accessibleName() or getattr(w, "text", lambda: "")())]
    assert unnamed == []


def test_the_picker_highlights_the_model_in_use_and_names_the_one_downloading(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    monkeypatch.setattr("app.gui.model_picker.Download", FakeDownload)
    other = list(catalog().values())[-1]
    picker = ModelPicker([], in_use=str(tmp_path / "models" / other.file))
    qtbot.addWidget(picker)
    assert picker.starters.currentRow() == list(catalog()).index(other.name)
    picker.use_starter()
    picker._progress(50_000_000, 100_000_000, "downloading part 1/2")
    label = picker.progress_label.text()
    assert label.startswith(f"{other.display_name}: downloading part 1/2, 50 of 100 MB (") and "MB/s)" in label
    assert ModelPicker([]).starters.currentRow() == 0  # none in use: the first, the best replies


def test_the_first_run_compiles_kernels_during_the_download(qtbot, tmp_path, monkeypatch, cold_kernels):
    from engine.platform import warmup

    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    monkeypatch.setattr("app.gui.model_picker.Download", FakeDownload)
    stages = []
    monkeypatch.setattr(warmup, "command", lambda name, stage: stages.append((name, stage)) or
                        [sys.executable, "-c", "import time; time.sleep(1)"])
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    [picker] = window.findChildren(ModelPicker)
    picker.starters.setCurrentRow(list(catalog()).index("smollm2-135m-instruct"))
    picker.use_starter()
    assert stages == [("smollm2-135m-instruct", stage) for stage in warmup.STAGES]
    bar = window.kernel_warmup.bar
    assert bar.isVisible() and bar.text() == "Preparing kernels for your CPU: 0%"
    window._model_loaded(str(tmp_path / "model.gguf"))  # the download and the load ended first
    assert window.composer.send_button.isEnabled()  # a message sent now waits for the kernels (test_first_reply)
    qtbot.waitUntil(lambda: not window.kernel_warmup.running, timeout=10_000)
    assert not bar.isVisible() and bar.value() == 100
    # then the verify stage, which nothing waits for
    assert stages[len(warmup.STAGES):] == [("smollm2-135m-instruct", stage) for stage in warmup.LATER_STAGES]
