"""Starting the desktop app: `fucina` with no command, or `fucina --screenshot PATH`; `--theme` picks the
look for that run."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def run(screenshot: str | None = None, conversation_id: str | None = None, theme: str | None = None) -> int:
    if screenshot is not None:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # a screenshot needs no display
    from app.gui.system_libraries import problem as missing_system_libraries

    if problem := missing_system_libraries():  # before Qt loads: without them it aborts the process
        print(f"error: {problem}", file=sys.stderr)
        return 2
    # Qt is imported here, not at module level, so the command line starts fast without it.
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication, QMessageBox

    from app.cli.desktop import APP_ID
    from app.gui.gc_policy import collect_on_gui_thread
    from app.gui.main_window import MainWindow
    from app.gui.qt_binding import binding_problem
    from app.gui.screenshot import Screenshot
    from engine.errors import FucinaError
    from engine.platform.locks import app_lock
    from engine.platform.paths import data_dir
    from engine.runtime import configure_threads
    from resources import resource_path

    if problem := binding_problem():
        print(f"error: {problem}", file=sys.stderr)
        return 2
    configure_threads()
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Fucina")
    app.setApplicationDisplayName("Fucina")
    app.setDesktopFileName(APP_ID)  # the desktop entry `fucina install-desktop` installs
    app.setWindowIcon(QIcon(str(resource_path(f"icons/{APP_ID}.svg"))))
    collect_on_gui_thread(app)  # never on the engine's worker thread (app.gui.gc_policy)
    lock = None
    try:  # one app per data dir: two would stream into one conversation and race on its sidecar
        lock = app_lock(data_dir())
        window = MainWindow(conversation_id, first_run_picker=screenshot is None, theme=theme)
    except FucinaError as e:  # DataDirInUse; a data dir that cannot be written to or a history.db not readable
        if lock is not None:
            lock.release()
        if screenshot is not None:
            raise  # the command line prints it
        print(f"error: {e}", file=sys.stderr)
        QMessageBox.critical(None, "Fucina", str(e))
        return 2
    try:
        if screenshot is not None:
            Screenshot(window, Path(screenshot))
        window.show()
        return app.exec()
    finally:
        lock.release()
