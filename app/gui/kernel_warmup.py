"""The first run's kernel warm-up (engine.platform.warmup) seen from the window: its stages run as child
processes (QProcess, so nothing blocks this thread) while a starter model downloads, or as soon as one on
disk is opened, and a progress bar in the status bar shows how far they are, from the kernels each stage
reports as it compiles them. A reply asked for meanwhile waits for them (the window holds it, and says
so): it would otherwise compile the same kernels itself, in competition with them. The verify stage
(speculation's kernels) runs after them, out of sight: replies decode plainly until it is done."""

from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QObject, QProcess, Signal
from PySide6.QtWidgets import QProgressBar

from engine.platform import warmup
from engine.platform.catalog import StarterModel, catalog, starter_of_file


class KernelWarmup(QObject):
    finished = Signal()           # the stages the first reply waits for ended (or none was needed)
    progress_changed = Signal(float)  # how far those stages are, 0 to 1

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._processes: list[QProcess] = []   # the stages the first reply waits for
        self._background: list[QProcess] = []  # the later stages
        self._later: list[str] = []            # the model whose later stages start when those end
        self.model: StarterModel | None = None  # the model those stages compile for
        self._compiled: dict[str, int] = {}    # kernels compiled so far, by stage
        self._ended: set[str] = set()
        self.bar = QProgressBar()
        self.bar.setAccessibleName("Preparing the model's kernels")
        self.bar.setToolTip("Compiling the model's kernels for this CPU; a one-time step on the first run")
        self.bar.setRange(0, 100)
        self.bar.setFixedWidth(260)  # its text whole beside a long status line
        self.bar.hide()

    @property
    def running(self) -> bool:
        """Stages the first reply waits for are under way."""
        return bool(self._processes)

    @property
    def progress(self) -> float:
        """How far the stages the first reply waits for are, 0 to 1."""
        return warmup.progress(self.model, self._compiled, self._ended) if self.model else 1.0

    def warms(self, path: str | None) -> bool:
        """Whether a reply of the model file at `path` waits for these stages."""
        return self.running and path is not None and starter_of_file(path) == self.model

    def start(self, name: str) -> None:
        """Warm up starter model `name` unless done before (or already under way)."""
        model = catalog().get(name)
        if self.running or model is None or not model.kernels:
            return
        self._later = [] if warmup.is_warm(model, warmup.LATER_STAGES) else [name]
        if warmup.is_warm(model):
            self._start_later()
            return
        self.model, self._compiled, self._ended = model, {}, set()
        self.bar.setFormat("Preparing kernels for your CPU: %p%")
        self._show_progress()
        self.bar.show()
        for stage in warmup.STAGES:
            process = self._run(name, stage, lambda p, s=stage: self._read(p, s))
            process.finished.connect(lambda *_, p=process, s=stage: self._stage_ended(p, s))
            self._processes.append(process)

    def _run(self, name: str, stage: str, on_output: Callable[[QProcess], None] | None = None) -> QProcess:
        """A stage's process; its report lines go to `on_output` (None: nowhere)."""
        program, *arguments = warmup.command(name, stage)
        process = QProcess(self)
        process.setProcessChannelMode(QProcess.ProcessChannelMode.ForwardedErrorChannel)
        if on_output is None:
            process.setStandardOutputFile(QProcess.nullDevice())
        else:
            process.readyReadStandardOutput.connect(lambda: on_output(process))
        process.start(program, arguments)
        return process

    def _read(self, process: QProcess, stage: str) -> None:
        while process.canReadLine():
            count = warmup.compiled_count(bytes(process.readLine()).decode(errors="replace"))
            if count is not None:
                self._compiled[stage] = count
        self._show_progress()

    def _show_progress(self) -> None:
        self.bar.setValue(round(100 * self.progress))
        self.progress_changed.emit(self.progress)

    def _stage_ended(self, process: QProcess, stage: str) -> None:
        if process not in self._processes:
            return
        self._processes.remove(process)
        process.deleteLater()
        self._ended.add(stage)
        self._show_progress()
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
