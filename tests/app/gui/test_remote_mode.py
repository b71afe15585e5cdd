"""The app on a remote endpoint: `fucina serve`'s app on a tiny model (uvicorn in a thread), chosen in the
model picker (models listed from /v1/models), remembered for the next start with its key, chatting with
streaming into a locally stored conversation; a stub endpoint that drops the connection mid-reply gives a
clear error, and the text received stays in the chat and the store."""

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from app.gui.main_window import PREFERENCES_FILE
from app.gui.preferences import Preferences
from engine.serving.remote import INTERRUPTED
from tests.app.gui.conftest import TURN_TIMEOUT_MS
from tests.serving import serving_tiny, stub_endpoint

KEY = "gui-remote-key"


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    with serving_tiny(tmp_path_factory.mktemp("gui-remote"), KEY) as url:
        yield url


def send(qtbot, window, text):
    window.composer.input.setPlainText(text)
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    assert window.streaming
    qtbot.waitUntil(lambda: not window.streaming, timeout=TURN_TIMEOUT_MS)


def errors(window):
    return [box.text() for box in window.findChildren(QMessageBox) if box.isVisible()]


def test_the_picker_lists_the_endpoints_models_and_the_chat_streams_through_it(qtbot, open_window, endpoint,
                                                                               fucina_home):
    window = open_window()
    picker = window.choose_model()
    picker.remote.url.setText(endpoint)
    picker.remote.api_key.setText(KEY)
    assert not picker.remote.use_button.isEnabled()  # no model chosen yet
    picker.remote.list_button.click()
    qtbot.waitUntil(lambda: picker.remote.models.count() == 1, timeout=10_000)
    assert picker.remote.models.currentText() == "tiny"
    with qtbot.waitSignal(window.client.worker.remote_connected, timeout=10_000):
        picker.remote.use_button.click()
    qtbot.waitUntil(lambda: window.model_button.text() == f"tiny at {endpoint}")
    window.apply_settings({"system_prompt": None, "sampler": {"temperature": 0.0, "max_tokens": 8}})
    updates = []
    window.client.worker.reply_text.connect(lambda text, _turn: updates.append(text))
    send(qtbot, window, "hello")
    assert not errors(window)
    user, reply = window.store.active_branch(window.current_id)
    assert user["content"] == "hello" and reply["role"] == "assistant" and reply["content"]
    assert "".join(updates) == reply["content"] == window.chat_view.widgets[-1].content
    assert reply["meta"]["model"] == f"tiny at {endpoint}"
    assert window.store.get_conversation(window.current_id)["model"] == f"tiny at {endpoint}"
    assert "tok/s" in window.status_line.text()
    # remembered with its key (in the preferences file of the data directory), and used at the next start
    window.close()
    saved = Preferences(fucina_home / PREFERENCES_FILE)
    assert saved.remote_in_use and saved.remote_endpoint == {"url": endpoint, "api_key": KEY, "model": "tiny"}
    window = open_window()
    assert window.model_button.text() == f"tiny at {endpoint}"
    send(qtbot, window, "again")
    assert [m["role"] for m in window.store.active_branch(window.current_id)] == ["user", "assistant"] * 2


def test_a_wrong_key_is_refused_and_the_local_model_stays(qtbot, open_window, endpoint):
    window = open_window()
    local = window.model_button.text()
    with qtbot.waitSignal(window.client.worker.remote_failed, timeout=10_000):
        window.use_remote({"url": endpoint, "api_key": "wrong", "model": "tiny"})
    qtbot.waitUntil(lambda: bool(errors(window)))
    assert "check the API key" in errors(window)[0] and f"Still using {local}" in errors(window)[0]
    assert window.model_button.text() == local and not window.preferences.remote_in_use


def test_a_connection_lost_mid_reply_is_told_and_the_text_received_is_kept(qtbot, open_window):
    window = open_window()
    with stub_endpoint(["Hel", "lo"]) as url:
        with qtbot.waitSignal(window.client.worker.remote_connected, timeout=10_000):
            window.use_remote({"url": url, "api_key": "", "model": "stub"})
        qtbot.waitUntil(lambda: window.model_button.text() == f"stub at {url}")  # the window has it too
        send(qtbot, window, "hi")
    qtbot.waitUntil(lambda: bool(errors(window)))
    # the stub's close reaches the client as the stream's end or as a reset, whichever the timing gives
    message = errors(window)[0]
    assert ("closed the connection" in message or "connection reset" in message.lower()) \
        and "kept in the conversation" in message
    user, reply = window.store.active_branch(window.current_id)
    assert reply["content"] == "Hello" and reply["meta"]["finish_reason"] == INTERRUPTED
    assert window.chat_view.widgets[-1].content == "Hello"
