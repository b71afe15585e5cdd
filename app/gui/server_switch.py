"""The settings dialog's "Local server" switch: serves the loaded model to other apps over an
OpenAI-compatible API on this computer only (app.local_server, run by the engine worker), showing its
URL, its API key and how many requests it has served. The switch acts at once, like a light switch."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QCheckBox, QGroupBox, QLabel, QVBoxLayout

from app.gui.preferences import Preferences
from app.gui.worker import EngineClient

REFRESH_MS = 1000


class ServerSwitch(QGroupBox):
    def __init__(self, client: EngineClient, preferences: Preferences):
        super().__init__("Local server")
        self.client, self.preferences = client, preferences
        self.switch = QCheckBox("Serve the loaded model to other apps on this computer (OpenAI-compatible API)")
        self.switch.setAccessibleName("Local server")
        self.details = QLabel()
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.setAccessibleName("Local server details")
        column = QVBoxLayout(self)
        column.addWidget(self.switch)
        column.addWidget(self.details)
        self._timer = QTimer(self, interval=REFRESH_MS, timeout=self._show)
        client.worker.server_changed.connect(self._changed)
        client.worker.server_failed.connect(self._failed)
        self._show()
        self.switch.setChecked(client.worker.server is not None)
        self.switch.toggled.connect(self._switched)

    def _switched(self, on: bool) -> None:
        if on:
            self.details.setText("Starting…")
            self.client.start_server(self.preferences.server_port, self.preferences.server_api_key)
        else:
            self.client.stop_server()

    def _changed(self, running) -> None:
        self.switch.blockSignals(True)
        self.switch.setChecked(running is not None)
        self.switch.blockSignals(False)
        self._show()

    def _failed(self, message: str) -> None:
        self._changed(None)
        self.details.setText(message)

    def _show(self) -> None:
        server = self.client.worker.server  # read once: the worker thread may stop it meanwhile
        if server is None:
            self._timer.stop()
            self.details.setText("Off.")
            return
        self._timer.start()
        served = server.requests_served
        self.details.setText(f"URL: {server.url}\nAPI key: {server.api_key}\n"
                             f"{served:,} request{'s' * (served != 1)} served")
