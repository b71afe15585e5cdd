"""Python's cyclic garbage collector runs on the GUI thread only.

The collector runs in whichever thread crosses its allocation threshold. When that is the engine's worker
(loading a model allocates hundreds of thousands of objects), it can finalize the Python wrappers of Qt
objects the GUI thread owns, which Qt does not allow from another thread: the GUI tests crashed with a
segmentation fault "Garbage-collecting" on the worker thread while a model loaded. So automatic
collection is off while the app runs, and a timer on the GUI thread collects instead, each generation when
its own threshold says so (as the automatic collector would), so a full collection stays rare.
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

CHECK_INTERVAL_MS = 250


def collect_on_gui_thread(parent: QObject) -> QTimer:
    """Turn automatic collection off and collect from a timer owned by `parent` (on the GUI thread).
    Stopping the timer (or deleting `parent`) should go with gc.enable()."""
    gc.disable()
    timer = QTimer(parent)
    timer.setInterval(CHECK_INTERVAL_MS)
    timer.timeout.connect(collect_due)
    timer.start()
    return timer


def collect_due() -> int:
    """Collect the oldest generation whose count passed its threshold (none: nothing to do); the number of
    objects collected."""
    counts, thresholds = gc.get_count(), gc.get_threshold()
    for generation in (2, 1, 0):
        if counts[generation] > thresholds[generation]:
            return gc.collect(generation)
    return 0
