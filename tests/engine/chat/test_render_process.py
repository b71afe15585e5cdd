"""The limited child process: results and exceptions come back, overruns are killed, the next call recovers."""

import os
import sys
import time

import pytest

from engine.chat.render_process import LimitedProcess

_HOARD = []  # in the child: what hoard() keeps alive


def hoard(size: int) -> int:
    _HOARD.append(bytearray(size))
    return len(_HOARD)


@pytest.fixture
def limited():
    processes = []

    def make(handler, memory_limit=64 << 20):
        processes.append(LimitedProcess(handler, memory_limit))
        return processes[-1]

    yield make
    for p in processes:
        p.close()


def test_results_and_exceptions_come_back(limited):
    p = limited(int)
    assert p.call("12", timeout_s=30) == 12
    with pytest.raises(ValueError, match="invalid literal"):
        p.call("twelve", timeout_s=30)
    assert p.call("7", 16, timeout_s=30) == 7


def test_an_overrun_is_killed_at_the_timeout_and_the_next_call_gets_a_fresh_child(limited):
    p = limited(time.sleep)
    p.call(0, timeout_s=30)
    first = p.pid
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        p.call(60, timeout_s=0.3)
    assert time.monotonic() - start < 2.0
    assert p.pid is None
    assert p.call(0, timeout_s=30) is None
    assert p.pid not in (None, first)


def test_a_child_that_dies_mid_call_is_an_error_and_is_replaced(limited):
    p = limited(os._exit)
    with pytest.raises(ChildProcessError):
        p.call(3, timeout_s=30)
    with pytest.raises(ChildProcessError):  # a fresh child, which the handler ends again
        p.call(3, timeout_s=30)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is enforced on Linux only")
def test_the_childs_memory_is_capped(limited):
    p = limited(bytearray, memory_limit=128 << 20)
    assert len(p.call(16 << 20, timeout_s=30)) == 16 << 20
    assert p.memory_limited
    with pytest.raises(MemoryError):
        p.call(1 << 30, timeout_s=30)
    assert len(p.call(16 << 20, timeout_s=30)) == 16 << 20  # the same child carries on


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the address space is read on Linux only")
def test_a_child_that_stays_grown_retires_after_replying(limited):
    p = limited(hoard, memory_limit=128 << 20)
    assert p.call(1 << 20, timeout_s=30) == 1
    assert p.call(1 << 20, timeout_s=30) == 2 and p.pid is not None  # grown a little: the same child
    assert p.call(48 << 20, timeout_s=30) == 3
    assert p.pid is None  # grown past a quarter of its allowance: gone
    assert p.call(1 << 20, timeout_s=30) == 1  # a fresh child
