"""The app's local server (app.local_server) on a tiny model: a second adapter over the engine service the
app's chat goes through, served on loopback behind its key, counting only the requests it served, and
gone once stopped while the service goes on."""

import httpx
import pytest

from app.local_server import LocalServer
from engine.errors import FucinaError
from engine.serving.service import EngineService

KEY = "local-key"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.models import load_model
    from tests.synthetic import write_tiny_model

    path = tmp_path_factory.mktemp("local-server") / "tiny.gguf"
    write_tiny_model(path, "qwen2", tokenizer=True, tied=False, seed=1)
    return load_model(path)


def test_serves_behind_its_key_counts_its_requests_and_stops(tiny, tmp_path):
    service = EngineService(tiny, slots=2, capacity=256, sidecar_dir=tmp_path)
    auth = {"authorization": f"Bearer {KEY}"}
    try:
        server = LocalServer(service, port=0, api_key=KEY)
        try:
            assert server.url.startswith("http://127.0.0.1:") and server.requests_served == 0
            assert httpx.get(f"{server.url}/models").status_code == 401
            (model,) = [m["id"] for m in httpx.get(f"{server.url}/models", headers=auth).json()["data"]]
            assert model == "tiny"
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            reply = httpx.post(f"{server.url}/chat/completions", json=body, headers=auth, timeout=60).json()
            assert reply["choices"][0]["message"]["content"] is not None
            assert list(service.relay(iter(["the app's own chat"])))  # not one of the server's requests
            assert server.requests_served == 1
            with pytest.raises(FucinaError, match=f"cannot serve on 127.0.0.1:{server.port}"):
                LocalServer(service, port=server.port, api_key=KEY)
        finally:
            server.stop()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{server.url}/models", headers=auth)
        again = LocalServer(service, port=0, api_key=KEY)  # switched on again: counted from there
        try:
            assert again.requests_served == 0
        finally:
            again.stop()
    finally:
        service.close()
