"""A private asyncio event loop on its own daemon thread, for async libraries (the MCP SDK) called from
sync code: the engine's worker thread, the command line. Each call blocks its caller, never the loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Coroutine


class LoopThread:
    def __init__(self, name: str):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        """The coroutine's result, run on the loop; raises what it raises, or concurrent.futures.TimeoutError
        after `timeout` seconds (the coroutine is cancelled then)."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:  # TimeoutError itself from Python 3.11 on
            future.cancel()
            raise

    def close(self) -> None:
        """Stop the loop and its thread (the coroutines on it should have ended first)."""
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
