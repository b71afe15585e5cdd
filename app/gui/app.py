"""Starting the desktop app: `fucina` with no command, or `fucina --screenshot PATH`."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def run(screenshot: str | None = None, conversation_id: str | None = None) -> int:
    if screenshot is not None:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # a screenshot needs no display
    # Qt is imported here, not at module level, so the command line starts fast without it.
    from PySide6.QtWidgets import QApplication

    from app.gui.main_window import MainWindow
    from app.gui.screenshot import Screenshot
    from engine.runtime import configure_threads

    configure_threads()
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Fucina")
    app.setApplicationDisplayName("Fucina")
    window = MainWindow(conversation_id, first_run_download=screenshot is None)
    if screenshot is not None:
        Screenshot(window, Path(screenshot))
    window.show()
    return app.exec()
