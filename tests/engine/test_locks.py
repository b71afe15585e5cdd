"""engine.platform.locks: the app's single-instance lock per data dir and the per-conversation streaming lock."""

import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import DataDirInUse
from engine.platform.locks import FileLock, app_lock, conversation_lock

REPO = Path(__file__).parents[2]

_HOLDER = """
import sys
from engine.platform.locks import FileLock
lock = FileLock(sys.argv[1])
print("held" if lock.try_acquire() else "refused", flush=True)
sys.stdin.readline()
"""


def test_a_lock_held_by_another_process_is_refused_until_it_ends(tmp_path):
    path = tmp_path / "locks" / "c.lock"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        lock = FileLock(path)
        assert not lock.try_acquire() and not lock.held
    finally:
        holder.communicate("\n", timeout=60)  # the holder exits; the OS drops its lock
    assert lock.try_acquire() and lock.held
    assert lock.try_acquire()  # already ours
    lock.release()
    assert not lock.held and FileLock(path).try_acquire()


def test_the_app_lock_is_one_per_data_dir(tmp_path):
    first = app_lock(tmp_path / "a")
    with pytest.raises(DataDirInUse, match=r"already running on the data dir .*a; .*FUCINA_HOME"):
        app_lock(tmp_path / "a")
    second = app_lock(tmp_path / "b")  # another data dir is another app
    first.release()
    app_lock(tmp_path / "a").release()
    second.release()


def test_conversation_locks_live_beside_the_history_db(tmp_path):
    lock = conversation_lock(tmp_path / "history.db", "abc")
    assert lock.path == tmp_path / "locks" / "abc.lock"
    assert lock.try_acquire()
    assert not conversation_lock(tmp_path / "history.db", "abc").try_acquire()
    assert conversation_lock(tmp_path / "history.db", "def").try_acquire()
