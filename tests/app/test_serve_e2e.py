"""`fucina serve` as a subprocess on a free loopback port, driven by the official openai client and httpx:
replies whole and streamed, the API key, a client disconnecting mid-stream, bad requests that leave it
serving, and a restart after which a resent conversation is warm (cached_tokens > 0)."""

import contextlib
import os
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

KEY = "test-key-0123"


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from tests.synthetic import write_tiny_model

    path = tmp_path_factory.mktemp("serve") / "tiny.gguf"
    write_tiny_model(path, "qwen2", tokenizer=True, tied=False, seed=1)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(model, *args) -> list[str]:
    return [sys.executable, "-m", "app.cli", "serve", str(model), *args]


@contextlib.contextmanager
def serving(model, home, *, ctx=256):
    port = free_port()
    env = os.environ | {"FUCINA_HOME": str(home), "FUCINA_THREADS": "1"}
    proc = subprocess.Popen(serve_command(model, "--port", str(port), "--ctx", str(ctx), "--slots", "2",
                                          "--api-key", KEY),
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"fucina serve exited with {proc.returncode}: {proc.stderr.read()}")
            try:
                if httpx.get(f"{url}/models", headers=auth(), timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("fucina serve did not answer within 180 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()  # uvicorn shuts down cleanly on SIGTERM: the service flushes its slot sidecars
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def auth(key: str = KEY) -> dict:
    return {"authorization": f"Bearer {key}"}


def status(url) -> dict:
    return httpx.get(f"{url}/fucina/status", headers=auth()).json()


def test_serve_end_to_end_and_warm_after_a_restart(tiny_path, tmp_path):
    question = [{"role": "user", "content": "Tell me about the sea, at length."}]
    with serving(tiny_path, tmp_path) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        assert [m.id for m in client.models.list()] == ["tiny"]

        whole = client.chat.completions.create(model="tiny", messages=question, max_tokens=12, seed=3,
                                               temperature=1.0)
        reply = whole.choices[0].message.content
        stream = client.chat.completions.create(model="tiny", messages=question, max_tokens=12, seed=3,
                                                temperature=1.0, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == reply

        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
        assert httpx.get(f"{url}/models").status_code == 401

        # a client that goes away mid-stream stops its generation
        body = {"model": "tiny", "messages": question, "max_tokens": 200, "stream": True, "temperature": 1.0}
        with httpx.stream("POST", f"{url}/chat/completions", json=body, headers=auth(), timeout=30) as r:
            assert r.status_code == 200
            next(r.iter_lines())
        deadline = time.monotonic() + 30
        while status(url)["finished"].get("cancelled", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        now = status(url)
        assert now["finished"].get("cancelled") == 1 and now["live"] == 0

        # bad requests get their status and leave the server serving
        post = lambda content: httpx.post(f"{url}/chat/completions", content=content, timeout=30,
                                          headers=auth() | {"content-type": "application/json"})
        assert post(b"{not json").status_code == 400
        assert post(b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1000000000}'
                    ).status_code == 400
        with contextlib.suppress(httpx.TransportError):  # the server may close the socket before reading it all
            assert post(b" " * (50 * 2**20)).status_code == 413
        assert client.chat.completions.create(model="tiny", messages=question, max_tokens=2).choices

    with serving(tiny_path, tmp_path) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        resent = question + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
        again = client.chat.completions.create(model="tiny", messages=resent, max_tokens=4, seed=3)
        assert again.usage.prompt_tokens_details.cached_tokens >= whole.usage.prompt_tokens - 1
        assert again.model_extra["fucina"]["ttft_ms"] > 0


def test_serve_refuses_a_public_address_without_a_key(tiny_path, tmp_path):
    env = os.environ | {"FUCINA_HOME": str(tmp_path)}
    env.pop("FUCINA_API_KEY", None)
    done = subprocess.run(serve_command(tiny_path, "--host", "0.0.0.0", "--port", str(free_port())), env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "--api-key" in done.stderr and len(done.stderr.splitlines()) == 1
