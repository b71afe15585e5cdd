"""A persistent child process that runs one function under limits that C code cannot escape.

Checks inside the Python process can only weigh values and watch the clock between Python steps; one C call
(a huge power, a padded format) runs to completion holding the GIL, and nothing can stop it or cap what it
allocates. A child process can be both killed and capped: the parent waits for each call's reply with a
wall-clock timeout (its thread sleeps in poll without the GIL, so the app stays responsive) and kills the
child when it overruns; the next call starts a fresh one. On Linux the child caps its own address space
(RLIMIT_AS) at its size after start-up plus `memory_limit`, so an oversized allocation fails there as a
MemoryError; a child whose heap stays grown by a quarter of that after a call (the allocator keeps freed
memory) retires after replying, so every call gets close to the full allowance. macOS accepts RLIMIT_AS
without enforcing it and Windows has no resource limits: there the wall-clock kill still holds and
`memory_limited` is False.

The child is a multiprocessing "spawn" child: the start method every platform has, safe in a process with
threads (Qt's), and the one a frozen (PyInstaller) app supports, provided its entry point calls
multiprocessing.freeze_support() first (app.cli.main does). `handler` must be a module-level function,
pickled by name and imported by the child. As with any spawn child, the child imports the parent's main
module, so a script that uses the engine keeps its work under `if __name__ == "__main__":`.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import threading
from typing import Any, Callable

_READY = "ready"


class ProcessUnavailable(OSError):
    """The child process cannot be started here (or did not start in time)."""


class LimitedProcess:
    """Calls `handler(*args)` in a child process, one call at a time (thread-safe), each under a timeout."""

    def __init__(self, handler: Callable[..., Any], memory_limit: int, *, start_timeout_s: float = 60.0):
        self._handler, self._memory_limit, self._start_timeout_s = handler, memory_limit, start_timeout_s
        self._lock = threading.Lock()
        self._process: Any = None
        self._conn: Any = None
        self.memory_limited = False  # whether the running child's address space is capped

    def call(self, *args: Any, timeout_s: float) -> Any:
        """The handler's result, or the exception it raised. TimeoutError when it ran past `timeout_s` and
        ChildProcessError when the child died during the call (the child is gone either way; the next call
        starts another); ProcessUnavailable when no child can be started."""
        with self._lock:
            conn = self._running()
            try:
                conn.send(args)
                replied = conn.poll(timeout_s)
                if replied:
                    ok, value, retired = conn.recv()
            except (EOFError, OSError):  # killed (e.g. by the kernel) or died mid-call
                self._stop()
                raise ChildProcessError("the child process died") from None
            if not replied:
                self._stop()
                raise TimeoutError(f"no reply within {timeout_s:g} s")
            if retired:
                self._stop()
        if ok:
            return value
        raise value

    def close(self) -> None:
        with self._lock:
            self._stop()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _running(self):
        if self._process is not None and self._process.is_alive():
            return self._conn
        self._stop()
        context = multiprocessing.get_context("spawn")
        conn, child_end = context.Pipe()
        process = context.Process(target=_serve, args=(child_end, self._handler, self._memory_limit),
                                  name="fucina-limited", daemon=True)
        try:
            process.start()
        except Exception as e:  # no processes here (a sandbox, a frozen app without freeze_support)
            raise ProcessUnavailable(f"cannot start a child process: {type(e).__name__}: {e}") from None
        finally:
            child_end.close()
        self._process, self._conn = process, conn
        try:
            if not conn.poll(self._start_timeout_s):
                raise EOFError
            ready, self.memory_limited = conn.recv()
            if ready != _READY:
                raise EOFError
        except (EOFError, OSError, ValueError, TypeError):
            self._stop()
            raise ProcessUnavailable("the child process did not start") from None
        return conn

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join(5)
            self._conn.close()
        self._process = self._conn = None
        self.memory_limited = False


def _serve(conn, handler: Callable[..., Any], memory_limit: int) -> None:
    """The child's loop: one reply per request until the parent closes the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is for the parent to handle
    start_size = _address_space()
    if start_size is not None:
        _limit_address_space(start_size + memory_limit)
    conn.send((_READY, start_size is not None))
    while True:
        try:
            args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            ok, value = True, handler(*args)
        except BaseException as e:  # noqa: BLE001 (every failure is the caller's to see)
            ok, value = False, e
        retire = start_size is not None and _address_space() > start_size + memory_limit // 4
        try:
            conn.send((ok, value, retire))
        except Exception as e:  # an unpicklable result or exception, or no memory left to pickle it
            conn.send((False, RuntimeError(f"{type(e).__name__}: {e}"), retire))
        if retire:
            return


def _address_space() -> int | None:
    """This process's address-space size in bytes, where it can be read and capped (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    import resource

    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def _limit_address_space(size: int) -> None:
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (size if hard == resource.RLIM_INFINITY else min(size, hard), hard))
