"""A disk that refuses writes: full, read-only, a file size limit, an unusable history.db. Each is a StoreError
naming the file and what to do, and nothing committed before is lost."""

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import StorageFull, StorageReadOnly, StoreError
from engine.history import HistoryStore

REPO = Path(__file__).parents[3]


@pytest.fixture
def store(tmp_path):
    with HistoryStore(tmp_path / "history.db") as s:
        yield s


def committed(store, cid):
    return [m["content"] for m in store.active_branch(cid)]


def fill_up(store) -> None:
    """SQLite's own limit on the file's pages: past it, writes fail with SQLITE_FULL as on a full disk."""
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages}")


def test_a_full_disk_is_a_clear_error_and_keeps_what_was_committed(store):
    cid = store.create_conversation("m")
    store.add_message(cid, "user", "kept")
    store.add_message(cid, "assistant", "also kept")
    fill_up(store)
    with pytest.raises(StorageFull, match=r"history\.db: database or disk is full; free some disk space"):
        store.add_message(cid, "user", "x" * 100_000)
    export = store.export_json(cid)
    export["conversation"]["active_leaf"] = None
    export["messages"] = [{"id": str(i), "parent_id": None, "role": "user", "content": "y" * 10_000}
                          for i in range(20)]
    with pytest.raises(StorageFull):
        store.import_json(export)
    assert committed(store, cid) == ["kept", "also kept"]
    assert len(store.list_conversations()) == 1  # the import left nothing half-written
    assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    store.db.execute("PRAGMA max_page_count = 1000000")  # space returns: the same store writes again
    store.add_message(cid, "user", "x" * 100_000)
    assert len(committed(store, cid)) == 3


def test_a_read_only_database_is_a_clear_error(store):
    cid = store.create_conversation("m")
    store.add_message(cid, "user", "kept")
    store.db.execute("PRAGMA query_only = 1")  # what SQLite does with a file it could open only for reading
    with pytest.raises(StorageReadOnly, match="history.db: attempt to write a readonly database; make it"):
        store.rename(cid, "new title")
    assert committed(store, cid) == ["kept"] and store.get_conversation(cid)["title"] == "kept"


def test_an_immutable_history_db_opens_for_reading_and_refuses_writes(tmp_path, monkeypatch):
    path = tmp_path / "history.db"
    with HistoryStore(path) as s:
        cid = s.create_conversation("m")
        s.add_message(cid, "user", "kept")
    connect = sqlite3.connect  # an immutable (chattr +i) file: SQLite falls back to opening it read-only
    monkeypatch.setattr(sqlite3, "connect", lambda f, *a, **k: connect(f"file:{f}?mode=ro", *a, uri=True, **k))
    with HistoryStore(path) as s:
        assert committed(s, cid) == ["kept"]
        with pytest.raises(StorageReadOnly, match="FUCINA_HOME"):
            s.add_message(cid, "user", "more")


@pytest.mark.parametrize("make, error, match", [
    (lambda p: p.mkdir(), StorageReadOnly, "unable to open database file"),
    (lambda p: p.write_bytes(b"not a database" * 100), StoreError, "not a readable history database"),
    (lambda p: p.parent.rmdir() or p.parent.write_text("a file"), StoreError, "data.history.db: File exists"),
])
def test_an_unusable_history_db_is_a_clear_error(tmp_path, make, error, match):
    path = tmp_path / "data" / "history.db"
    path.parent.mkdir()
    make(path)
    with pytest.raises(error, match=match):
        HistoryStore(path)


_SIZE_LIMITED = """
import resource, signal, sys
from engine.errors import StoreError
from engine.history import HistoryStore
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so a write past the limit fails with EFBIG instead
store = HistoryStore(sys.argv[1])
cid = store.create_conversation("m")
store.add_message(cid, "user", "kept")
resource.setrlimit(resource.RLIMIT_FSIZE, (store.path.with_name("history.db-wal").stat().st_size, -1))
try:
    store.add_message(cid, "assistant", "x" * 200_000)
except StoreError as e:
    print(type(e).__name__, e)
"""


def test_a_file_size_limit_fails_the_write_cleanly(tmp_path):
    """A real failing write(2) (EFBIG past RLIMIT_FSIZE), as a full disk gives ENOSPC."""
    path = tmp_path / "history.db"
    result = subprocess.run([sys.executable, "-c", _SIZE_LIMITED, str(path)], capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("StoreError cannot write") and "the disk may be full" in result.stdout
    with HistoryStore(path) as s:
        [conv] = s.list_conversations()
        assert committed(s, conv["id"]) == ["kept"]
        assert s.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
