"""Choosing a model: the starter models, the one with the best replies first (size, one-line description,
downloaded or not, and the speed it wrote replies at on this machine once it has), recently used files, any
.gguf file on disk, or a remote OpenAI-compatible endpoint (app.gui.remote_endpoint). A starter
model not downloaded yet downloads here with a progress bar and a Cancel button. The dialog only picks a
model: loading it (and reporting a bad one) is the engine's."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import (QDialog, QFileDialog, QHBoxLayout, QLabel, QListWidget, QListWidgetItem,
                               QMessageBox, QProgressBar, QPushButton, QVBoxLayout, QWidget)

from app.gui.downloader import Download
from app.gui.remote_endpoint import RemoteEndpointBox
from engine.errors import FucinaError
from engine.models import footprint
from engine.platform.catalog import StarterModel, TransferRate, catalog, model_display_name, starter_of_file

PATH_ROLE = Qt.ItemDataRole.UserRole


def model_label(path: str | None) -> str:
    """A starter model's display name, else the file name."""
    return model_display_name(path) if path else "No model"


def starter_row(path: str | None) -> int:
    """The starter list's row of the model at `path` (the one in use), else the first's (the best replies)."""
    starter = starter_of_file(path) if path else None
    return list(catalog().values()).index(starter) if starter else 0


def _footprint(path: str) -> footprint.Footprint | None:
    """The model file's footprint from its header, None where it is not a GGUF. Reading a header parses the
    tokenizer's string arrays: about 0.2 s for a 150k-token vocabulary, so never on the UI thread."""
    try:
        return footprint.file_footprint(path)
    except (OSError, FucinaError):
        return None  # loading it reports what is wrong


def _footprint_line(path: str) -> str:
    """"\nqwen3moe, 30.5B parameters (3.3B per token), 17.3 GB; too large for this machine" for a listed file."""
    fp = _footprint(path)
    if fp is None:
        return ""
    fit = ("" if footprint.fits(fp) else "; streams its experts from disk here" if footprint.opens(fp)
           else "; too large for this machine's memory")
    return f"\n{footprint.describe(fp)}{fit}"


class _Described(QObject):
    """Carries each recent file's footprint line from the thread that reads the headers to the dialog (a
    signal emitted there is delivered on the UI thread, and not at all once the dialog is gone)."""
    line = Signal(str, str)  # path, its line


def describe_in_background(paths: list[str], show: Callable[[str, str], None]) -> threading.Thread:
    """`show(path, line)` on the UI thread for each file, as its header is read on a thread of its own."""
    described = _Described()
    described.line.connect(show)

    def run() -> None:
        for path in paths:
            described.line.emit(path, _footprint_line(path))

    thread = threading.Thread(target=run, name="fucina-model-headers", daemon=True)
    thread.start()
    return thread


class ModelPicker(QDialog):
    model_chosen = Signal(str)   # the .gguf file to load
    download_started = Signal(str)  # the starter model's name
    remote_chosen = Signal(dict)    # the remote endpoint to use: {"url", "api_key", "model"}

    def __init__(self, recent: list[str], parent: QWidget | None = None, *, first_run: bool = False,
                 in_use: str | None = None, remote: dict | None = None, speeds: dict[str, float] | None = None):
        """`in_use`: the model file loaded now, highlighted among the starters; `remote`: the endpoint last
        used, filled in; `speeds`: the decode rate models wrote replies at here, by file name."""
        super().__init__(parent)
        self.setWindowTitle("Choose a model")
        self.setMinimumWidth(560)
        self.download: Download | None = None
        self._rate = TransferRate()
        intro = QLabel("Welcome! The starter model with the best replies is downloading. Cancel it to choose a "
                       "smaller one for a slow machine, or to open a GGUF model file you already have."
                       if first_run else "Starter models, recent files, or any GGUF model file.")
        intro.setWordWrap(True)
        self.starters = QListWidget()
        self.starters.setAccessibleName("Starter models")
        for model in catalog().values():
            self.starters.addItem(self._starter_item(model, (speeds or {}).get(model.file)))
        self.starters.setCurrentRow(starter_row(in_use))
        self.starters.itemActivated.connect(lambda _: self.use_starter())
        self.recent = QListWidget()
        self.recent.setAccessibleName("Recent model files")
        for path in recent:
            if Path(path).is_file():
                item = QListWidgetItem(f"{model_label(path)} — {path}")
                item.setData(PATH_ROLE, path)
                self.recent.addItem(item)
        listed = [self.recent.item(i).data(PATH_ROLE) for i in range(self.recent.count())]
        self.headers = describe_in_background(listed, self._show_footprint)  # the dialog opens at once
        self.recent.itemActivated.connect(lambda item: self.choose(item.data(PATH_ROLE)))
        self.use_button = QPushButton("Download and use")
        self.use_button.clicked.connect(self.use_starter)
        self.starters.currentItemChanged.connect(self._update_use_button)
        self._update_use_button()
        open_file = QPushButton("Open a .gguf file…")
        open_file.clicked.connect(self.open_file)
        self.progress = QProgressBar()
        self.progress.setAccessibleName("Download progress")
        self.progress_label = QLabel()
        self.cancel_button = QPushButton("Cancel download")
        self.cancel_button.clicked.connect(self.cancel_download)
        for widget in (self.progress, self.progress_label, self.cancel_button):
            widget.hide()
        self.remote = RemoteEndpointBox(remote)
        self.remote.endpoint_chosen.connect(self.choose_remote)

        buttons = QHBoxLayout()
        buttons.addWidget(open_file)
        buttons.addStretch()
        buttons.addWidget(self.use_button)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(QLabel("<b>Starter models</b>"))
        layout.addWidget(self.starters)
        if self.recent.count():
            layout.addWidget(QLabel("<b>Recently used</b>"))
            layout.addWidget(self.recent)
        layout.addWidget(self.progress_label)
        layout.addWidget(self.progress)
        layout.addWidget(self.cancel_button)
        layout.addLayout(buttons)
        layout.addWidget(self.remote)
        if first_run:  # the first command of the README starts the app on a model: the first offered downloads
            QTimer.singleShot(0, self.use_starter)

    def _show_footprint(self, path: str, line: str) -> None:
        for i in range(self.recent.count()):
            item = self.recent.item(i)
            if item.data(PATH_ROLE) == path:
                item.setText(f"{model_label(path)} — {path}{line}")

    @staticmethod
    def _starter_item(model: StarterModel, speed: float | None) -> QListWidgetItem:
        status = "downloaded" if model.is_downloaded() else "not downloaded"
        here = "" if speed is None else f", {speed:,.0f} tok/s here"
        item = QListWidgetItem(f"{model.display_name}   ({model.size / 1e6:,.0f} MB, {status}{here})\n"
                               f"{model.description}")
        item.setData(PATH_ROLE, model.name)
        return item

    def _update_use_button(self) -> None:
        item = self.starters.currentItem()
        model = item and catalog()[item.data(PATH_ROLE)]
        self.use_button.setText("Use" if model and model.is_downloaded() else "Download and use")

    # -- choosing --------------------------------------------------------------------------------
    def choose(self, path: str) -> None:
        """Use the model file at `path`, unless this machine's memory cannot hold it, even with its experts
        streamed from disk (said, not loaded)."""
        fp = _footprint(path)
        if fp is not None and not footprint.opens(fp):
            QMessageBox.warning(self, "Model too large", f"{Path(path).name}: {footprint.describe(fp)}.\n\n"
                                f"It {footprint.memory_verdict(fp)}. Choose a smaller model or a smaller "
                                "quantization of it.")
            return
        self.model_chosen.emit(path)
        self.accept()

    def choose_remote(self, endpoint: dict) -> None:
        self.remote_chosen.emit(endpoint)
        self.accept()

    def open_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a model", str(Path.home()), "GGUF models (*.gguf)")
        if path:
            self.choose(path)

    def use_starter(self) -> None:
        item = self.starters.currentItem()
        if item is None or self.download is not None:
            return
        model = catalog()[item.data(PATH_ROLE)]
        if model.is_downloaded():
            self.choose(str(model.path()))
            return
        self.download = Download(model.name)
        self._rate = TransferRate()
        self.download.progress.connect(self._progress)
        self.download.done.connect(self._downloaded)
        self.download.failed.connect(self._download_failed)
        self.download.cancelled.connect(self._download_ended)
        self.progress_label.setText(f"Downloading {model.display_name}…")
        self.progress.setRange(0, 0)
        for widget in (self.progress, self.progress_label, self.cancel_button):
            widget.show()
        self.use_button.setEnabled(False)
        self.download.start()
        self.download_started.emit(model.name)

    # -- downloading -----------------------------------------------------------------------------
    def _downloaded(self, path: str) -> None:
        self._forget_download()
        self.choose(path)

    def _progress(self, done: int, total: int, stage: str) -> None:
        self.progress.setRange(0, 1000)
        self.progress.setValue(int(1000 * done / max(total, 1)))
        name = catalog()[self.download.name].display_name if self.download else ""
        self.progress_label.setText(f"{name}: {stage}, {done / 1e6:,.0f} of {total / 1e6:,.0f} MB "
                                    f"({self._rate.update(done) / 1e6:,.1f} MB/s)")

    def cancel_download(self) -> None:
        if self.download is not None:
            self.download.cancel()
            self.progress_label.setText("Cancelling…")

    def _download_failed(self, message: str) -> None:
        self._download_ended()
        QMessageBox.critical(self, "Download failed", message)

    def _download_ended(self) -> None:
        self._forget_download()
        for widget in (self.progress, self.cancel_button):
            widget.hide()
        self.progress_label.setText("Download stopped; downloading again resumes it.")
        self.use_button.setEnabled(True)

    def _forget_download(self) -> None:
        """Drop the download once its thread has ended. Its outcome signals are queued from the end of its
        run(), so the thread may still be returning: the reference is this thread's only owner, and a QThread
        destroyed while it runs aborts the app (it did, on quit after a download)."""
        if self.download is not None:
            self.download.wait()
            self.download = None

    def done(self, result: int) -> None:
        """Closing the dialog, however it closes, stops a download that is still running."""
        if self.download is not None:
            self.download.cancel()
            self._forget_download()
        super().done(result)
