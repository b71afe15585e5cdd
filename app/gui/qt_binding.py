"""A Qt binding that loses references crashes the app minutes later, far from the cause: check it first.

PySide6 6.12.0 returns True from `Signal.emit` without taking a reference to it. On Python before 3.12,
where True is an ordinary counted object, every emit (the engine thread sends ~30 a second while a reply
streams) brings it closer to being freed, and the app dies with "Fatal Python error: bool_dealloc" (the
trial saw it on quit). Python 3.12+ makes True immortal, so there the loss is harmless.
"""

from __future__ import annotations

import sys

PROBE_EMITS = 64
FIX = "pip install 'PySide6-Essentials!=6.12.0'"


def emit_loses_references() -> bool:
    """Whether emitting a signal loses a reference to the value emit returns."""
    from PySide6.QtCore import QObject, Signal

    class Probe(QObject):
        ping = Signal()

    probe = Probe()
    before = sys.getrefcount(True)
    for _ in range(PROBE_EMITS):
        probe.ping.emit()
    return sys.getrefcount(True) < before - PROBE_EMITS // 2  # a few stray references come and go


def binding_problem() -> str | None:
    """Why this Qt binding cannot run the app, with the command that fixes it; None when it can."""
    if not emit_loses_references():
        return None
    import PySide6

    return (f"PySide6 {PySide6.__version__} loses a reference on every signal and would crash Fucina "
            f"(\"bool_dealloc\") within minutes; install another version: {FIX}")
