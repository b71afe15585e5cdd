"""Servers for the remote-engine tests, in this process: `fucina serve`'s app on uvicorn in a thread (a
real socket, as a remote endpoint is), and a stub endpoint that answers the way a broken server does."""

import contextlib
import json
import socket
import threading
import time

import uvicorn


@contextlib.contextmanager
def serving_tiny(directory, api_key: str | None = None):
    """`fucina serve`'s app on a tiny random model (files under `directory`), served as "tiny": its URL."""
    from app.server import create_app
    from app.server_requests import Limits
    from engine.models import load_model
    from engine.serving.service import EngineService
    from tests.synthetic import write_tiny_model

    path = directory / "tiny.gguf"
    write_tiny_model(path, "qwen2", tokenizer=True, tied=False, seed=1)  # untied: varied replies
    service = EngineService(load_model(path), slots=2, capacity=256, sidecar_dir=directory / "slots")
    try:
        with serving_app(create_app(service, ["tiny"], api_key=api_key, limits=Limits(max_tokens=256))) as url:
            yield url
    finally:
        service.close()


@contextlib.contextmanager
def serving_app(app):
    """The ASGI `app` on a free loopback port; yields its API base URL (…/v1)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sse_chunk(text: str) -> bytes:
    body = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text},
                                                            "finish_reason": None}]}
    return f"data: {json.dumps(body)}\n\n".encode()


@contextlib.contextmanager
def stub_endpoint(pieces=(), *, declared_length: int | None = None, silent: bool = False):
    """An endpoint that lists the model "stub" and answers every chat with `pieces` as stream chunks, then
    closes the connection without the stream's end; `declared_length`: a Content-Length longer than what
    it sends (the body is cut, not ended); `silent`: it accepts requests and never answers them."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                data = conn.recv(65536)
                if not data:
                    return
                request += data
            if silent:
                stop.wait(30)
                return
            if request.startswith(b"GET"):
                body = json.dumps({"object": "list", "data": [{"id": "stub", "object": "model"}]}).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(body), body))
                return
            length = b"content-length: %d\r\n" % declared_length if declared_length else b""
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n" + length
                         + b"\r\n" + b"".join(sse_chunk(p) for p in pieces))

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join(5)
        listener.close()
