"""The SQLite history store: CRUD, message trees, search, export/import, migrations, crash safety."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.errors import FucinaError
from engine.history import HistoryError, HistoryStore
from engine.history.schema import MIGRATIONS
from tests.engine.history.conftest import old_conversation


@pytest.fixture
def store(tmp_path):
    with HistoryStore(tmp_path / "history.db") as s:
        yield s


def test_conversation_crud(store):
    a = store.create_conversation("qwen2.5-0.5b", sampler={"temperature": 0.7, "seed": 1})
    b = store.create_conversation("smollm2-135m", title="Second")
    conv = store.get_conversation(a)
    assert conv["model"] == "qwen2.5-0.5b" and conv["sampler"] == {"temperature": 0.7, "seed": 1}
    assert conv["title"] is None and conv["pinned"] is False
    assert [c["id"] for c in store.list_conversations()] == [b, a]  # newest first
    store.set_pinned(a, True)
    store.rename(b, "Renamed")
    assert [c["id"] for c in store.list_conversations()] == [a, b]  # pinned first
    store.update_settings(a, system_prompt="Be terse.", sampler={"top_k": 40})
    conv = store.get_conversation(a)
    assert conv["system_prompt"] == "Be terse." and conv["sampler"] == {"top_k": 40}
    assert conv["model"] == "qwen2.5-0.5b"
    assert store.get_conversation(b)["title"] == "Renamed"
    with pytest.raises(HistoryError, match="unknown sampler"):
        store.update_settings(a, sampler={"temprature": 1})
    store.delete_conversation(b)
    with pytest.raises(FucinaError):
        store.get_conversation(b)


def test_conversations_list_a_page_at_a_time_in_the_same_order(store):
    ids = [store.create_conversation("m", title=str(i)) for i in range(5)]
    store.set_pinned(ids[0], True)
    order = [c["id"] for c in store.list_conversations()]
    assert order == [ids[0], ids[4], ids[3], ids[2], ids[1]]
    pages = [[c["id"] for c in store.list_conversations(limit=2, offset=at)] for at in (0, 2, 4, 6)]
    assert pages == [order[:2], order[2:4], order[4:], []]


def test_first_user_message_titles_the_conversation(store):
    cid = store.create_conversation("m")
    store.add_message(cid, "system", "You are helpful.")
    store.add_message(cid, "user", "  Explain   the difference between " + "x" * 100)
    title = store.get_conversation(cid)["title"]
    assert title.startswith("Explain the difference between") and len(title) <= 60
    store.add_message(cid, "user", "another")
    assert store.get_conversation(cid)["title"] == title


def test_tree_branches_siblings_and_active_branch(store):
    cid = store.create_conversation("m")
    u1 = store.add_message(cid, "user", "hi")
    a1 = store.add_message(cid, "assistant", "hello", meta={"tokens_per_s": 42.0})
    regen = store.branch(a1, "hey there")
    assert [m["id"] for m in store.siblings(a1)] == [a1, regen]
    assert [m["content"] for m in store.active_branch(cid)] == ["hi", "hey there"]
    u2 = store.add_message(cid, "user", "more")
    edit = store.branch(u1, "hi, edited")
    assert [m["id"] for m in store.active_branch(cid)] == [edit]
    # Switching back to the first user turn follows its newest replies down to a leaf.
    assert store.set_active_leaf(cid, u1) == u2
    assert [m["id"] for m in store.active_branch(cid)] == [u1, regen, u2]
    assert store.get_message(a1)["meta"] == {"tokens_per_s": 42.0}
    with pytest.raises(HistoryError):
        store.add_message(cid, "robot", "x")
    other = store.create_conversation("m")
    with pytest.raises(HistoryError):
        store.add_message(other, "user", "x", parent_id=u1)


def test_delete_message_removes_subtree_and_moves_active_leaf(store):
    cid = store.create_conversation("m")
    u1 = store.add_message(cid, "user", "one")
    a1 = store.add_message(cid, "assistant", "two")
    store.add_message(cid, "user", "three")
    store.delete_message(a1)
    assert store.get_conversation(cid)["active_leaf"] == u1
    assert [m["id"] for m in store.active_branch(cid)] == [u1]
    assert store.search("three") == []  # the FTS index follows cascaded deletes


def test_delete_conversation_cascades(store):
    cid = store.create_conversation("m")
    store.add_message(cid, "user", "findable words")
    store.add_attachment(cid, "notes.txt", "text", "notes.txt")
    assert len(store.attachments(cid)) == 1
    store.delete_conversation(cid)
    for table in ("messages", "attachments"):
        assert store.db[table].count == 0
    assert store.search("findable") == []
    with pytest.raises(HistoryError):
        store.delete_conversation(cid)


@pytest.mark.parametrize("query", ['"', 'say "hello', "AND", "OR NOT", "a*", "content:x", "(", "it's", "-", ""])
def test_search_escapes_user_input(store, query):
    cid = store.create_conversation("m")
    store.add_message(cid, "user", 'She said "hello" AND left. It\'s (maybe) content: x-ray')
    store.search(query)  # never raises


def test_search_finds_words_with_punctuation(store):
    cid = store.create_conversation("m")
    mid = store.add_message(cid, "user", 'She said "hello world" and left.')
    store.add_message(cid, "assistant", "Nothing relevant here.")
    hits = store.search('"hello, world!')
    assert [(h["conversation_id"], h["message_id"]) for h in hits] == [(cid, mid)]
    assert "[hello]" in hits[0]["snippet"]


def _tree(store, cid):
    """The conversation's tree as nested (role, content) tuples, independent of ids."""
    msgs = store.export_json(cid)["messages"]

    def under(parent):
        return [(m["role"], m["content"], m["meta"], under(m["id"])) for m in msgs if m["parent_id"] == parent]

    return under(None)


def test_export_import_round_trip(store):
    cid = store.create_conversation("m", system_prompt="sys", sampler={"temperature": 0.2, "ctx": 4096})
    u1 = store.add_message(cid, "user", "q")
    a1 = store.add_message(cid, "assistant", "a", meta={"tokens": 3})
    store.branch(a1, "a2")
    store.branch(u1, "q2")
    store.add_message(cid, "assistant", "a3")
    data = json.loads(json.dumps(store.export_json(cid)))  # survives a trip through a file
    new = store.import_json(data)
    assert new != cid
    assert _tree(store, new) == _tree(store, cid)
    assert [m["content"] for m in store.active_branch(new)] == ["q2", "a3"]
    old_ids = {m["id"] for m in data["messages"]}
    assert old_ids.isdisjoint(m["id"] for m in store.export_json(new)["messages"])
    conv = store.get_conversation(new)
    assert conv["sampler"] == {"temperature": 0.2, "ctx": 4096} and conv["system_prompt"] == "sys"
    md = store.export_markdown(new)
    assert md.startswith("# q") and "## Assistant\n\na3" in md and "a2" not in md


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.update(format="other"), "format"),
    (lambda d: d["messages"][1].update(role="robot"), "role"),
    (lambda d: d["messages"][1].update(parent_id="nope"), "parent_id"),
    (lambda d: d["messages"][0].update(parent_id=d["messages"][1]["id"]), "cycle"),
    (lambda d: d["messages"].append(dict(d["messages"][0])), "unique"),
    (lambda d: d["conversation"].pop("model"), "model"),
])
def test_import_rejects_malformed_input(store, mutate, match):
    cid = store.create_conversation("m")
    store.add_message(cid, "user", "q")
    store.add_message(cid, "assistant", "a")
    data = store.export_json(cid)
    mutate(data)
    with pytest.raises(HistoryError, match=match):
        store.import_json(data)
    assert len(store.list_conversations()) == 1  # nothing half-imported
    with pytest.raises(HistoryError):
        store.import_json("not a dict")


def test_migrations_recorded_and_reopen_idempotent(tmp_path):
    path = tmp_path / "h.db"
    with HistoryStore(path) as s:
        assert s.schema_version == len(MIGRATIONS)
        cid = s.create_conversation("m")
        s.add_message(cid, "user", "kept")
        assert s.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with HistoryStore(path) as s:
        assert s.db.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == len(MIGRATIONS)
        assert [m["content"] for m in s.active_branch(cid)] == ["kept"]
        assert s.db.execute("PRAGMA foreign_keys").fetchone()[0] == 1


def test_a_version_1_database_keeps_its_attachments_and_gains_their_document_columns(tmp_path, monkeypatch):
    import engine.history.store as history_store

    path = tmp_path / "h.db"
    monkeypatch.setattr(history_store, "MIGRATIONS", MIGRATIONS[:1])
    with HistoryStore(path) as s:
        cid = old_conversation(s.db)
        s.db.execute("INSERT INTO attachments VALUES ('a', ?, 'notes.txt', 'text', 'notes.txt', '2000-01-01T00:00:00+00:00')", [cid])
        s.db.conn.commit()
    monkeypatch.undo()
    with HistoryStore(path) as s:
        assert s.schema_version == len(MIGRATIONS)
        [row] = s.attachments(cid)
        assert (row["name"], row["document"], row["tokens"]) == ("notes.txt", None, None)  # read again on reopen
        s.update_attachment("a", document="ab" * 32, tokens=40)
        s.add_attachment(cid, "b.md", "text", "b.md", "cd" * 32, 7)
        assert [(r["name"], r["tokens"]) for r in s.attachments(cid)] == [("notes.txt", 40), ("b.md", 7)]
        s.remove_attachment("a")
        assert [r["name"] for r in s.attachments(cid)] == ["b.md"]
        with pytest.raises(HistoryError):
            s.remove_attachment("a")


def test_default_path_honours_fucina_home(tmp_path, monkeypatch):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    assert HistoryStore.default_path() == tmp_path / "history.db"
    monkeypatch.delenv("FUCINA_HOME")
    assert HistoryStore.default_path().parts[-2:] == ("fucina", "history.db")


_WRITER = """
import sys
from engine.history import HistoryStore
store = HistoryStore(sys.argv[1])
cid = store.create_conversation("m")
print("conv", cid, flush=True)
i = 0
while True:
    mid = store.add_message(cid, "user" if i % 2 == 0 else "assistant", f"turn {i} " + "x" * 2000)
    print("msg", mid, flush=True)
    i += 1
"""


def test_sigkill_keeps_every_committed_message(tmp_path):
    path = tmp_path / "h.db"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).parents[3])  # the repo root, so `engine` imports
    lines = []
    deadline = time.monotonic() + 30
    while len(lines) < 30 and time.monotonic() < deadline:
        lines.append(proc.stdout.readline().split())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lines += [line.split() for line in proc.stdout.read().splitlines()]
    cid = lines[0][1]
    committed = [mid for kind, mid in lines[1:] if kind == "msg"]
    assert len(committed) >= 20
    with HistoryStore(path) as s:
        stored = [m["id"] for m in s.active_branch(cid)]
        assert stored[: len(committed)] == committed
        assert s.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_the_markdown_export_names_the_model_not_its_path(store, tmp_path):
    from engine.platform.catalog import catalog

    starter = next(iter(catalog().values()))
    cid = store.create_conversation(str(tmp_path / "models" / starter.file))
    other = store.create_conversation(str(tmp_path / "mine" / "tiny.gguf"))
    assert f"Model: {starter.display_name}\n" in store.export_markdown(cid)
    assert "Model: tiny.gguf\n" in store.export_markdown(other)
    assert str(tmp_path) not in store.export_markdown(cid) + store.export_markdown(other)


def test_decode_speeds_are_the_median_of_each_models_stored_replies(store, tmp_path):
    cid = store.create_conversation(str(tmp_path / "models" / "a.gguf"))
    for model, tps in (("a.gguf", 10.0), ("a.gguf", 30.0), ("a.gguf", 12.0), ("b.gguf", 50.0), ("b.gguf", 0.0)):
        store.add_message(cid, "user", "hi")
        store.add_message(cid, "assistant", "hello", meta={"model": str(tmp_path / "models" / model),
                                                            "decode_tps": tps})
    store.add_message(cid, "assistant", "from before the meta had a model", meta={"decode_tps": 99.0})
    assert store.decode_speeds() == {"a.gguf": 12.0, "b.gguf": 50.0}  # a reply that stopped at once counts for nothing
