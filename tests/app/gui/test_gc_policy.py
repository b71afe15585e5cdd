"""Garbage is collected on the GUI thread, never by whichever thread allocates (app.gui.gc_policy)."""

import gc
import threading
import weakref

from app.gui.gc_policy import collect_due


class _Node:
    pass


def _cycle():
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def _garbage_cycles():
    """More unreachable cycles than the youngest generation's threshold: the automatic collector would run."""
    return [_cycle() for _ in range(gc.get_threshold()[0])]


def test_a_worker_allocating_never_collects_and_the_gui_thread_does(qtbot):
    assert not gc.isenabled()  # the package fixture installed the app's policy
    collected_on = []
    gc.callbacks.append(lambda phase, info: phase == "start" and collected_on.append(threading.get_ident()))
    try:
        dead = []
        worker = threading.Thread(target=lambda: dead.extend(_garbage_cycles()))
        worker.start()
        worker.join()
        assert all(ref() is not None for ref in dead) and not collected_on  # the worker collected nothing
        qtbot.waitUntil(lambda: all(ref() is None for ref in dead), timeout=5000)  # the GUI thread's timer did
        assert set(collected_on) == {threading.get_ident()}
    finally:
        gc.callbacks.pop()


def test_collect_due_collects_only_a_generation_past_its_threshold():
    gc.collect()
    assert collect_due() == 0
    dead = _garbage_cycles()
    assert collect_due() > 0
    assert all(ref() is None for ref in dead)
