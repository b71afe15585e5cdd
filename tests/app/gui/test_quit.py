"""Threads end before what owns them goes: the quit crash of the trial ("bool_dealloc") and the download
thread destroyed while it still ran."""

import threading
import time

from app.gui.downloader import Download
from app.gui.main_window import MainWindow
from app.gui.model_picker import ModelPicker
from app.gui.qt_binding import emit_loses_references


def test_the_qt_binding_keeps_its_references():
    assert not emit_loses_references()  # PySide6 6.12.0 on Python 3.11 lost one per emit


class LingeringDownload(Download):
    """A real download thread (no network) whose thread goes on a moment after its outcome signal, as a
    thread that is still returning from run(); every instance is kept so none is destroyed while it runs."""
    made: list["LingeringDownload"] = []
    gate: threading.Event | None = None  # set: pull() waits for it or for a cancel

    def __init__(self, name):
        super().__init__(name)
        LingeringDownload.made.append(self)

    def run(self):
        super().run()
        time.sleep(0.3)


def fake_pull(name, progress, cancel):
    progress(1, 2, "downloading")
    while LingeringDownload.gate is not None and not LingeringDownload.gate.is_set():
        if cancel.wait(0.01):
            from engine.errors import DownloadCancelled
            raise DownloadCancelled("cancelled")
    return f"/models/{name}.gguf"


def patch_download(monkeypatch, gate=None):
    LingeringDownload.made, LingeringDownload.gate = [], gate
    monkeypatch.setattr("app.gui.model_picker.Download", LingeringDownload)
    monkeypatch.setattr("app.gui.downloader.pull", fake_pull)


def test_a_finished_download_has_ended_its_thread_before_the_model_is_chosen(qtbot, monkeypatch, tmp_path):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))  # nothing downloaded
    patch_download(monkeypatch)
    picker = ModelPicker([])
    qtbot.addWidget(picker)
    running_when_chosen = []
    picker.model_chosen.connect(lambda _: running_when_chosen.append(LingeringDownload.made[0].isRunning()))
    picker.use_starter()
    qtbot.waitUntil(lambda: bool(running_when_chosen), timeout=10_000)
    assert running_when_chosen == [False] and picker.download is None


def test_quitting_during_a_download_stops_it_and_waits_for_its_thread(qtbot, monkeypatch, tmp_path):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    gate = threading.Event()
    patch_download(monkeypatch, gate)
    window = MainWindow()  # no model: the first run downloads the default one
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: bool(LingeringDownload.made) and LingeringDownload.made[0].isRunning(), timeout=10_000)
    try:
        window.close()
        assert not LingeringDownload.made[0].isRunning()
        assert window.client.thread.isFinished()
    finally:
        gate.set()  # before the fix the thread was left running: let it end
        LingeringDownload.made[0].wait()
