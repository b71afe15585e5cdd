"""The app on a disk that refuses writes, and a second app on the same data dir."""

import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QMessageBox

from engine.platform import storage_errors
from engine.history.store import HistoryStore
from engine.platform.locks import app_lock
from tests.app.gui.conftest import TURN_TIMEOUT_MS
from tests.app.gui.test_chat_flow import GREEDY, send, shown

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def refuse(monkeypatch):
    """refuse.add("assistant") makes the store refuse those messages as a full disk does, on any thread."""
    roles = set()
    add_message = HistoryStore.add_message

    def add_or_refuse(self, conversation_id, role, content, *args, **kwargs):
        if role in roles:
            raise storage_errors.full(self.path, "database or disk is full")
        return add_message(self, conversation_id, role, content, *args, **kwargs)

    monkeypatch.setattr(HistoryStore, "add_message", add_or_refuse)
    return roles


def test_a_reply_the_disk_refuses_stays_shown_with_a_banner_and_retry_saves_it(qtbot, open_window, refuse):
    window = open_window()
    window.apply_settings(GREEDY)
    refuse.add("assistant")
    send(qtbot, window, "What is the capital of France?")
    banner = window.storage_banner
    qtbot.waitUntil(banner.isVisible)
    assert "The last reply is not saved yet: cannot write" in banner.message.text()
    assert "database or disk is full" in banner.message.text()
    assert banner.retry.isVisible() and banner.copy.isVisible()
    (_, question), (role, reply) = shown(window)
    assert question == "What is the capital of France?" and role == "assistant" and reply
    assert [m["role"] for m in window.store.active_branch(window.current_id)] == ["user"]

    qtbot.mouseClick(banner.copy, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == reply
    qtbot.mouseClick(banner.retry, Qt.MouseButton.LeftButton)  # the disk is still full
    qtbot.waitUntil(lambda: banner.isVisible() and banner.retry.isVisible())
    refuse.clear()  # space is back
    qtbot.mouseClick(banner.retry, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not banner.isVisible(), timeout=TURN_TIMEOUT_MS)
    stored = window.store.active_branch(window.current_id)
    assert [(m["role"], m["content"]) for m in stored] == [("user", question), ("assistant", reply)]
    qtbot.waitUntil(lambda: shown(window) == [("user", question), ("assistant", reply)])


def test_a_refused_reply_survives_switching_conversations(qtbot, open_window, refuse):
    window = open_window()
    window.apply_settings(GREEDY)
    refuse.add("assistant")
    send(qtbot, window, "Hi")
    first = window.current_id
    reply = window.storage_banner.reply
    window.new_chat()  # the session closes; its unsaved reply stays with the engine
    refuse.clear()
    qtbot.mouseClick(window.storage_banner.retry, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not window.storage_banner.isVisible())
    assert [m["content"] for m in window.store.active_branch(first)] == ["Hi", reply]


def test_a_message_the_disk_refuses_goes_back_to_the_composer(qtbot, open_window, refuse):
    window = open_window()
    window.apply_settings(GREEDY)
    send(qtbot, window, "Hi")
    refuse.add("user")
    send(qtbot, window, "Are you there?")
    banner = window.storage_banner
    qtbot.waitUntil(banner.isVisible)
    assert banner.message.text().startswith("Not saved: cannot write") and not banner.retry.isVisible()
    assert window.composer.input.toPlainText() == "Are you there?"
    assert [m["content"] for m in window.store.active_branch(window.current_id)][0] == "Hi"
    refuse.clear()
    send(qtbot, window, "Are you there?")  # the next write that works clears the banner
    qtbot.waitUntil(lambda: not banner.isVisible())
    assert len(window.store.active_branch(window.current_id)) == 4


def test_a_second_app_on_the_data_dir_is_refused(qapp, fucina_home, monkeypatch, tmp_path):
    from app.gui.app import run

    told = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text: told.append(text))
    running = app_lock(fucina_home)  # the first app
    try:
        assert run() == 2
        assert told and told[0].startswith(f"Fucina is already running on the data dir {fucina_home}")
        png = tmp_path / "shot.png"
        shot = subprocess.run([sys.executable, "-m", "app.cli", "--screenshot", str(png)], cwd=REPO,
                              capture_output=True, text=True, timeout=TURN_TIMEOUT_MS / 1000)
        assert shot.returncode == 2 and shot.stderr.startswith("error: Fucina is already running")
        assert not png.exists()
    finally:
        running.release()


def test_a_failed_sidecar_write_is_told_in_the_banner(qtbot, open_window, monkeypatch):
    import errno

    from engine.kv import persist

    def disk_full(path, update):
        raise OSError(errno.ENOSPC, "No space left on device")

    window = open_window()
    window.apply_settings(GREEDY)
    monkeypatch.setattr(persist, "apply", disk_full)
    send(qtbot, window, "Hi")  # the turn's end tells the failed write before it
    banner = window.storage_banner
    qtbot.waitUntil(banner.isVisible)
    assert "could not write the sidecar" in banner.message.text() and "No space left" in banner.message.text()
    assert "The conversation is saved" in banner.message.text() and not banner.retry.isVisible()
    assert len(window.store.active_branch(window.current_id)) == 2


def test_an_unreadable_history_db_is_told_at_start(qapp, fucina_home, monkeypatch):
    from app.gui.app import run

    told = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text: told.append(text))
    (fucina_home / "history.db").write_bytes(b"not a database" * 100)
    assert run() == 2
    assert told and "history.db is not a readable history database" in told[0]
    app_lock(fucina_home).release()  # the failed start left no lock behind
