"""The app's local server (app.local_server) on a tiny model: served on loopback behind its key, counting
the requests it served, sharing the model's lock with the app's chat, and gone once stopped."""

import threading

import httpx
import pytest

from app.local_server import LocalServer
from engine.errors import FucinaError

KEY = "local-key"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.models import load_model
    from tests.synthetic import write_tiny_model

    path = tmp_path_factory.mktemp("local-server") / "tiny.gguf"
    write_tiny_model(path, "qwen2", tokenizer=True, tied=False, seed=1)
    return load_model(path)


def test_serves_behind_its_key_counts_requests_and_stops(tiny, tmp_path):
    lock = threading.Lock()
    server = LocalServer(tiny, port=0, api_key=KEY, model_lock=lock, sidecar_dir=tmp_path)
    auth = {"authorization": f"Bearer {KEY}"}
    try:
        assert server.url.startswith("http://127.0.0.1:") and server.requests_served == 0
        assert httpx.get(f"{server.url}/models").status_code == 401
        (model,) = [m["id"] for m in httpx.get(f"{server.url}/models", headers=auth).json()["data"]]
        assert model == "tiny"
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        with lock:  # the app's chat computing: the server's reply waits for it
            waiting = threading.Thread(target=httpx.post, args=(f"{server.url}/chat/completions",),
                                       kwargs={"json": body, "headers": auth, "timeout": 60})
            waiting.start()
            waiting.join(1.0)
            assert waiting.is_alive() and server.requests_served == 0
        waiting.join(60)
        assert server.requests_served == 1
        reply = httpx.post(f"{server.url}/chat/completions", json=body, headers=auth, timeout=60).json()
        assert reply["choices"][0]["message"]["content"] is not None and server.requests_served == 2
        with pytest.raises(FucinaError, match=f"cannot serve on 127.0.0.1:{server.port}"):
            LocalServer(tiny, port=server.port, api_key=KEY, sidecar_dir=tmp_path / "other")
    finally:
        server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/models", headers=auth)
