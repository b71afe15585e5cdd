"""`fucina serve`'s server inside the app: the app's loaded model served on loopback by an engine service
(engine/service.py) with the server's ASGI app (app/server.py) on uvicorn in a thread, behind an API key.
Qt-free: the app's worker starts and stops it (app.gui.worker).

The model is the one the app chats with; `model_lock` is shared with the app's chat, so the two never
compute at once (the chat holds it per reply piece, the service per decode round).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import uvicorn

from app.cli_serve import GRACEFUL_SHUTDOWN_S
from app.server import create_app
from app.server_requests import Limits
from engine.errors import FucinaError
from engine.service import EngineService

HOST = "127.0.0.1"
SLOTS = 2
CONTEXT = 4096
START_TIMEOUT_S = 30


class LocalServer:
    """Serving `model` on http://127.0.0.1:PORT/v1 from construction until `stop()`. Port 0: a free one."""

    def __init__(self, model, *, port: int, api_key: str, model_lock: threading.Lock | None = None,
                 sidecar_dir: str | os.PathLike | None = None):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((HOST, port))
        except OSError as e:
            listener.close()
            raise FucinaError(f"cannot serve on {HOST}:{port}: {e.strerror or e}; choose another port") from None
        self.port, self.api_key = listener.getsockname()[1], api_key
        path = Path(model.file.path)
        self.service = EngineService(model, slots=SLOTS, capacity=CONTEXT, model_lock=model_lock,
                                     sidecar_dir=sidecar_dir)
        app = create_app(self.service, [path.stem, path.name], api_key=api_key, limits=Limits(max_tokens=CONTEXT))
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                                     timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [listener]},
                                        name="fucina-local-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise FucinaError(f"the local server did not start on {HOST}:{self.port}")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    @property
    def requests_served(self) -> int:
        """Generation requests that ended, however they ended."""
        return sum(self.service.status()["finished"].values())

    def stop(self) -> None:
        """Stop listening, end the streams still running and wait for the slots' sidecars."""
        self._server.should_exit = True
        self._thread.join()
        self.service.close()
