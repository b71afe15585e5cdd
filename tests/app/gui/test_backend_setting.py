"""The backend setting: remembered between runs, offered in the settings dialog, named in the status line."""

from app.gui.preferences import Preferences
from app.gui.settings_dialog import SettingsDialog
from app.gui.status_line import describe
from app.gui.worker import EngineStatus


def test_the_backend_setting_is_remembered_and_offered(qtbot, tmp_path):
    assert Preferences(tmp_path / "gui.ini").backend == "auto"
    preferences = Preferences(tmp_path / "gui.ini")
    preferences.backend = "cuda"
    preferences.sync()
    dialog = SettingsDialog({"system_prompt": None, "sampler": {}}, Preferences(tmp_path / "gui.ini"))
    qtbot.addWidget(dialog)
    assert dialog.backend.currentText() == "cuda"
    assert [dialog.backend.itemText(i) for i in range(dialog.backend.count())] == ["auto", "cpu", "cuda", "gpu"]


def test_the_status_line_names_the_backend():
    status = EngineStatus(context_used=12, context_size=4096, backend="cuda")
    assert describe(status) == "context 12 / 4,096  ·  cold start  ·  on cuda"
