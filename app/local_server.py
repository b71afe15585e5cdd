"""`fucina serve`'s server inside the app: the server's ASGI app (app/server.py) on uvicorn in a thread, on
loopback behind an API key, over the engine service the app's chat already goes through (engine/serving/service.py:
the chat's replies and the server's jobs take turns on its compute thread). Qt-free: the app's worker
starts and stops it (app.gui.worker); stopping it leaves the service to the chat.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import uvicorn

from app.cli.serve import GRACEFUL_SHUTDOWN_S
from app.server import create_app
from app.server_requests import Limits
from engine.errors import FucinaError
from engine.serving.service import EngineService

HOST = "127.0.0.1"
START_TIMEOUT_S = 30


class LocalServer:
    """Serving `service`'s model on http://127.0.0.1:PORT/v1 from construction until `stop()`. Port 0: a
    free one."""

    def __init__(self, service: EngineService, *, port: int, api_key: str):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((HOST, port))
        except OSError as e:
            listener.close()
            raise FucinaError(f"cannot serve on {HOST}:{port}: {e.strerror or e}; choose another port") from None
        self.port, self.api_key = listener.getsockname()[1], api_key
        path = Path(service.model.file.path)
        self.service = service
        self._served_before = self._finished()  # the service outlives a server switched off and on
        app = create_app(service, [path.stem, path.name], api_key=api_key, limits=Limits(max_tokens=service.capacity))
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
        return self._finished() - self._served_before

    def _finished(self) -> int:
        return sum(self.service.status()["finished"].values())

    def stop(self) -> None:
        """Stop listening and end the streams still running (within the graceful shutdown's seconds)."""
        self._server.should_exit = True
        self._thread.join()
