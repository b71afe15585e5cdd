"""The command line's one progress bar, on stderr: a download counts megabytes, reading a document tokens."""

from __future__ import annotations

import sys
import time
from typing import Callable

from engine.platform.catalog import TransferRate

REDRAW_S = 0.1  # a terminal's line is redrawn at most this often within a stage

# (done, total, rate per second) -> how the bar's line shows them
Amounts = Callable[[int, int, float], str]


def megabytes(done: int, total: int, rate: float) -> str:
    return f"{done / 1e6:7.1f}/{total / 1e6:.1f} MB {rate / 1e6:6.1f} MB/s"


def tokens(done: int, total: int, rate: float) -> str:
    return f"{done}/{total} tokens {rate:6.1f} tok/s"


class ProgressBar:
    """A one-line progress bar (percentage, amounts, rate, stage), redrawn in place on a terminal; elsewhere
    the line once when a stage starts. Call it with (done, total, stage); close it, or use it as a context
    manager, to end its line."""

    def __init__(self, stream=None, width: int = 24, amounts: Amounts = megabytes):
        self.amounts = amounts
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = self.stream.isatty()
        self.rate = TransferRate()
        self.last_draw = 0.0
        self.stage = None
        self.drawn = False

    def __call__(self, done: int, total: int, stage: str) -> None:
        now = time.monotonic()
        rate = self.rate.update(done)
        new_stage = stage != self.stage
        self.stage = stage
        if self.tty:
            if new_stage or done == total or now - self.last_draw >= REDRAW_S:
                self.last_draw = now
                self.drawn = True
                self.stream.write("\r" + self._line(done, total, stage, rate) + "\x1b[K")
                self.stream.flush()
        elif new_stage:
            self.stream.write(self._line(done, total, stage, rate) + "\n")

    def _line(self, done: int, total: int, stage: str, rate: float) -> str:
        frac = done / total if total else 1.0
        filled = int(frac * self.width)
        return (f"[{'#' * filled}{'.' * (self.width - filled)}] {frac * 100:5.1f}% "
                f"{self.amounts(done, total, rate)}  {stage}")

    def close(self) -> None:
        if self.drawn:  # end the redrawn line so what follows starts on a fresh one
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
