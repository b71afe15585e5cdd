"""GUI tests run offscreen on the real default model, each on its own temporary data directory."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt loads: no display needed

import gc

import numba
import pytest

from engine.platform import warmup

MODEL = "smollm2-135m-instruct"
TURN_TIMEOUT_MS = 120_000
IS_WARM = warmup.is_warm


@pytest.fixture(autouse=True)
def kernels_warm(monkeypatch):
    """The kernel warm-up finds every model warm: the tests' kernels compile in the test process (and stay
    in Numba's cache), where its child processes would only compete with them."""
    monkeypatch.setattr(warmup, "is_warm", lambda model, stages=warmup.STAGES: True)


@pytest.fixture
def cold_kernels(monkeypatch, tmp_path):
    """The kernel warm-up sees a fresh machine's cache: no stage has run (the kernels this process compiled
    stay compiled)."""
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(warmup, "is_warm", IS_WARM)


@pytest.fixture(scope="package", autouse=True)
def gui_thread_gc(qapp):
    """As the app does: garbage is collected on the GUI thread only (app.gui.gc_policy); the tests after
    these get the automatic collector back."""
    from app.gui.gc_policy import collect_on_gui_thread

    timer = collect_on_gui_thread(qapp)
    yield
    timer.stop()
    gc.enable()
    gc.collect()


@pytest.fixture
def gui_model(model_path):
    """The model file the app opens with (a test module may override it with another model)."""
    return model_path(MODEL)


@pytest.fixture
def fucina_home(tmp_path, monkeypatch, gui_model):
    """A fresh data directory whose app remembers `gui_model` as the last model used."""
    from app.gui.main_window import PREFERENCES_FILE
    from app.gui.preferences import Preferences

    model = gui_model
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    preferences = Preferences(tmp_path / PREFERENCES_FILE)
    preferences.add_recent_model(str(model))
    preferences.sync()
    return tmp_path


@pytest.fixture
def open_window(qtbot, fucina_home):
    """Factory: a main window on the data directory, its model loaded."""
    from app.gui.main_window import MainWindow

    def open_(conversation_id=None):
        window = MainWindow(conversation_id)
        qtbot.addWidget(window)
        window.show()
        qtbot.waitUntil(lambda: window.model_path is not None, timeout=TURN_TIMEOUT_MS)
        return window

    return open_
