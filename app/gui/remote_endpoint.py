"""The model picker's "Remote endpoint" entry: an OpenAI-compatible endpoint's URL and API key, and its
model chosen from the list its /v1/models gives. Listing runs on a short-lived thread (a slow host must not
freeze the dialog); using the endpoint is the engine's (app.gui.worker), which reports a failure."""

from __future__ import annotations

import threading

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QLineEdit, QPushButton

from engine.errors import FucinaError
from engine.serving.remote import RemoteClient

LIST_TIMEOUT_S = 10.0


class RemoteEndpointBox(QGroupBox):
    endpoint_chosen = Signal(dict)     # {"url", "api_key", "model"}
    _listed = Signal(int, object, str)  # request number, model ids (None: failed), what went wrong

    def __init__(self, saved: dict | None = None):
        super().__init__("Remote endpoint")
        saved = saved or {}
        self.url = QLineEdit(saved.get("url", ""))
        self.url.setPlaceholderText("http://host:8080/v1")
        self.url.setAccessibleName("Endpoint URL")
        self.api_key = QLineEdit(saved.get("api_key", ""))
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.api_key.setPlaceholderText("none")
        self.api_key.setAccessibleName("API key")
        self.models = QComboBox()
        self.models.setAccessibleName("Endpoint model")
        if saved.get("model"):
            self.models.addItem(saved["model"])
        self.list_button = QPushButton("List models")
        self.list_button.clicked.connect(self.list_models)
        self.use_button = QPushButton("Use endpoint")
        self.use_button.clicked.connect(self.use)
        self.message = QLabel("vLLM, llama-server, Ollama or another Fucina: chats stay stored here.")
        self.message.setWordWrap(True)
        self._request = 0  # only the latest listing's answer is shown
        self._listed.connect(self._show_models)
        self.url.textChanged.connect(self._update_use_button)
        self.models.currentTextChanged.connect(self._update_use_button)
        model_row = QHBoxLayout()
        model_row.addWidget(self.models, 1)
        model_row.addWidget(self.list_button)
        model_row.addWidget(self.use_button)
        form = QFormLayout(self)
        form.addRow("URL", self.url)
        form.addRow("API key", self.api_key)
        form.addRow("Model", model_row)
        form.addRow(self.message)
        self._update_use_button()

    def endpoint(self) -> dict:
        return {"url": self.url.text().strip(), "api_key": self.api_key.text().strip(),
                "model": self.models.currentText()}

    def list_models(self) -> None:
        self._request += 1
        request, endpoint = self._request, self.endpoint()
        self.message.setText("Asking the endpoint for its models…")

        def ask() -> None:
            try:
                client = RemoteClient(endpoint["url"], endpoint["api_key"], connect_timeout_s=LIST_TIMEOUT_S,
                                      read_timeout_s=LIST_TIMEOUT_S)
                try:
                    answer = (request, client.models(), "")
                finally:
                    client.close()
            except FucinaError as e:
                answer = (request, None, str(e))
            try:
                self._listed.emit(*answer)  # queued to the UI thread
            except RuntimeError:  # the dialog closed meanwhile
                pass

        threading.Thread(target=ask, name="fucina-list-models", daemon=True).start()

    def _show_models(self, request: int, models: list[str] | None, error: str) -> None:
        if request != self._request:
            return
        if models is None:
            self.message.setText(error)
            return
        current = self.models.currentText()
        self.models.clear()
        self.models.addItems(models)
        if current in models:
            self.models.setCurrentText(current)
        self.message.setText(f"{len(models)} model{'s' * (len(models) != 1)} served" if models
                             else "The endpoint serves no model.")

    def _update_use_button(self) -> None:
        self.use_button.setEnabled(bool(self.url.text().strip() and self.models.currentText()))

    def use(self) -> None:
        self.endpoint_chosen.emit(self.endpoint())
