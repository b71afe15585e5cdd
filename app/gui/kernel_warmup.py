"""The first run's kernel warm-up (engine.platform.warmup) seen from the window: its stages run as child processes
(QProcess, so nothing blocks this thread) while the model downloads, and a progress bar in the status bar
shows how far they are. The window holds the first message until they end: the first reply would
otherwise compile the same kernels itself, in competition with them. The verify stage (speculation's
kernels) runs after them, out of sight: replies decode plainly until it is done."""

from __future__ import annotations

from PySide6.QtCore import QObject, QProcess, Signal
from PySide6.QtWidgets import QProgressBar

from engine.platform import warmup
from engine.platform.catalog import catalog


class KernelWarmup(QObject):
    finished = Signal()  # every stage ended (or none was needed)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._processes: list[QProcess] = []   # the stages the first reply waits for
        self._background: list[QProcess] = []  # the later stages
        self._later: list[str] = []            # the model whose later stages start when those end
        self.bar = QProgressBar()
        self.bar.setAccessibleName("Preparing the model's kernels")
        self.bar.setToolTip("Compiling the model's kernels; a one-time step on the first run")
        self.bar.setMaximumWidth(220)
        self.bar.hide()

    @property
    def running(self) -> bool:
        """Stages the first reply waits for are under way."""
        return bool(self._processes)

    def start(self, name: str) -> None:
        """Warm up starter model `name` unless done before (or already under way)."""
        model = catalog().get(name)
        if self.running or model is None or not model.kernels:
            return
        self._later = [] if warmup.is_warm(model, warmup.LATER_STAGES) else [name]
        if warmup.is_warm(model):
            self._start_later()
            return
        self.bar.setRange(0, len(warmup.STAGES))
        self.bar.setValue(0)
        self.bar.setFormat(f"Preparing {model.display_name.split(' (')[0]}: %v/%m")
        self.bar.show()
        for stage in warmup.STAGES:
            process = self._run(name, stage)
            process.finished.connect(lambda *_, p=process: self._stage_ended(p))
            self._processes.append(process)

    def _run(self, name: str, stage: str) -> QProcess:
        program, *arguments = warmup.command(name, stage)
        process = QProcess(self)
        process.setProcessChannelMode(QProcess.ProcessChannelMode.ForwardedErrorChannel)
        process.start(program, arguments)
        return process

    def _stage_ended(self, process: QProcess) -> None:
        if process not in self._processes:
            return
        self._processes.remove(process)
        process.deleteLater()
        self.bar.setValue(self.bar.value() + 1)
        if not self._processes:  # a failed stage costs only time: the first reply compiles what is missing
            self.bar.hide()
            self.finished.emit()
            self._start_later()

    def _start_later(self) -> None:
        if self._background:  # one at a time (a model left out compiles them in the engine, in the background)
            self._later = []
            return
        for name in self._later:
            for stage in warmup.LATER_STAGES:
                process = self._run(name, stage)
                process.finished.connect(lambda *_, p=process: self._later_ended(p))
                self._background.append(process)
        self._later = []

    def _later_ended(self, process: QProcess) -> None:
        if process in self._background:
            self._background.remove(process)
            process.deleteLater()

    def stop(self) -> None:
        """Quitting: end the stages now (what they compiled so far stays cached)."""
        processes, self._processes, self._background = self._processes + self._background, [], []
        for process in processes:
            process.kill()
            process.waitForFinished(5_000)
