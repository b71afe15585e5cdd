"""A server on the real default model shared by the Responses and Messages tests: one model load and one
service for both modules, behind an API key so that both clients' ways of sending it are exercised."""

import pytest
from starlette.testclient import TestClient

from app.server import create_app
from engine.serving.service import EngineService

SMOLLM2 = "smollm2-135m-instruct"
API_KEY = "test-key"


@pytest.fixture(scope="session")
def smollm2_server(model_path, tmp_path_factory):
    """An in-process HTTP client of the server; two slots, so a continued conversation must find its own."""
    from engine.models import load_model

    service = EngineService(load_model(model_path(SMOLLM2)), slots=2, capacity=1024,
                            sidecar_dir=tmp_path_factory.mktemp("slots"))
    http = TestClient(create_app(service, [SMOLLM2], api_key=API_KEY))
    yield http
    http.close()
    service.close()
