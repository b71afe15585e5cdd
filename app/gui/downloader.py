"""Downloads a starter model on a thread of its own, reporting progress; cancellable (the partial file
stays, so a later download resumes)."""

from __future__ import annotations

import threading

from PySide6.QtCore import QThread, Signal

from engine.platform.catalog import pull
from engine.errors import DownloadCancelled, FucinaError


class Download(QThread):
    progress = Signal(object, object, str)  # bytes done, bytes total, stage (object: sizes pass 2 GiB)
    done = Signal(str)                 # the model file
    failed = Signal(str)               # why (not emitted for a cancel)
    cancelled = Signal()

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self._cancel = threading.Event()

    def cancel(self) -> None:
        self._cancel.set()

    def run(self) -> None:
        try:
            path = pull(self.name, progress=self.progress.emit, cancel=self._cancel)
        except DownloadCancelled:
            self.cancelled.emit()
        except FucinaError as e:
            self.failed.emit(str(e))
        else:
            self.done.emit(str(path))
