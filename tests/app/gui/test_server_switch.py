"""The settings' "Local server" switch on the real default model: on, it serves the app's model on
loopback (the URL and key shown, called with httpx while the app's own chat replies through the same
engine service), counts the requests it served; off, the port is closed."""

import threading

import httpx
import pytest
from PySide6.QtCore import Qt

from tests.app.gui.conftest import TURN_TIMEOUT_MS


def test_the_switch_serves_the_loaded_model_and_stops(qtbot, open_window):
    window = open_window()
    window.preferences.server_port = 0  # any free port: tests run side by side
    dialog = window.edit_settings()
    switch = dialog.server_switch
    with qtbot.waitSignal(window.client.worker.server_changed, timeout=60_000):
        switch.switch.setChecked(True)
    server = window.client.worker.server
    key = window.preferences.server_api_key
    qtbot.waitUntil(lambda: server.url in switch.details.text())  # the switch hears of it on the UI thread
    assert key in switch.details.text()
    assert "0 requests served" in switch.details.text()
    auth = {"authorization": f"Bearer {key}"}
    (model,) = [m["id"] for m in httpx.get(f"{server.url}/models", headers=auth).json()["data"]]
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0}
    replies = []
    call = threading.Thread(target=lambda: replies.append(
        httpx.post(f"{server.url}/chat/completions", json=body, headers=auth, timeout=TURN_TIMEOUT_MS / 1000)))
    # the app's own chat replies meanwhile: through the same service, its model work on the service's thread
    computed_on = []
    window.client.worker.prefill_progress.connect(lambda *_: computed_on.append(threading.current_thread().name),
                                                  Qt.ConnectionType.DirectConnection)
    window.apply_settings({"system_prompt": None, "sampler": {"temperature": 0.0, "max_tokens": 8}})
    window.composer.input.setPlainText("Hello")
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    call.start()
    qtbot.waitUntil(lambda: not window.streaming and not call.is_alive(), timeout=TURN_TIMEOUT_MS)
    assert replies[0].status_code == 200 and replies[0].json()["choices"][0]["message"]["content"]
    assert window.store.active_branch(window.current_id)[-1]["role"] == "assistant"
    assert computed_on and set(computed_on) == {"fucina-engine"}
    qtbot.waitUntil(lambda: "1 request served" in switch.details.text(), timeout=5_000)
    with qtbot.waitSignal(window.client.worker.server_changed, timeout=60_000) as stopped:
        switch.switch.setChecked(False)
    assert stopped.args == [None] and window.client.worker.server is None
    qtbot.waitUntil(lambda: switch.details.text() == "Off.")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/models", headers=auth, timeout=5)
