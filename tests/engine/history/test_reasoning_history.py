"""A reply's reasoning in the history: stored apart from its answer, found by search, kept by export and
import, and added to databases made before it existed (schema 3) without losing their chats."""

import json

import pytest

from engine.history import HistoryStore
from engine.history.schema import MIGRATIONS
from tests.engine.history.conftest import old_conversation

REASONING = "The user wants a colour; blue is calm."


@pytest.fixture
def store(tmp_path):
    with HistoryStore(tmp_path / "history.db") as s:
        yield s


def chat_with_reasoning(store):
    cid = store.create_conversation("thinker.gguf")
    store.add_message(cid, "user", "Pick a colour")
    store.add_message(cid, "assistant", "Blue.", meta={"reasoning_ms": 3200.0}, reasoning=REASONING)
    return cid


def test_reasoning_is_stored_apart_and_searchable(store):
    cid = chat_with_reasoning(store)
    user, reply = store.active_branch(cid)
    assert (reply["content"], reply["reasoning"], reply["meta"]["reasoning_ms"]) == ("Blue.", REASONING, 3200.0)
    assert user["reasoning"] == ""
    [hit] = store.search("calm")  # a word only the reasoning has
    assert hit["message_id"] == reply["id"] and "[calm]" in hit["snippet"]
    assert [h["message_id"] for h in store.search("Blue")] == [reply["id"]]  # the answer, found once


def test_export_and_import_keep_the_split(store):
    cid = chat_with_reasoning(store)
    data = json.loads(json.dumps(store.export_json(cid)))  # through JSON text, as a file is
    assert [m.get("reasoning") for m in data["messages"]] == [None, REASONING]  # only a reply that reasoned
    copy = store.import_json(data)
    assert [(m["content"], m["reasoning"]) for m in store.active_branch(copy)] == [("Pick a colour", ""),
                                                                                  ("Blue.", REASONING)]
    markdown = store.export_markdown(cid)
    assert markdown.index("<summary>Thinking</summary>") < markdown.index(REASONING) < markdown.index("Blue.")


def test_an_export_from_before_reasoning_imports(store):
    cid = chat_with_reasoning(store)
    data = store.export_json(cid)
    for m in data["messages"]:
        m.pop("reasoning", None)
    copy = store.import_json(data)
    assert [m["reasoning"] for m in store.active_branch(copy)] == ["", ""]


def test_a_version_2_database_keeps_its_chats_and_gains_reasoning(tmp_path, monkeypatch):
    import engine.history.store as history_store

    path = tmp_path / "h.db"
    monkeypatch.setattr(history_store, "MIGRATIONS", MIGRATIONS[:2])
    with HistoryStore(path) as old:
        assert "reasoning" not in {c.name for c in old.db["messages"].columns}
        cid = old_conversation(old.db)
        old.db.execute("INSERT INTO messages (id, conversation_id, parent_id, role, content, created_at) "
                       "VALUES ('u', ?, NULL, 'user', 'old question', '2026-01-01T00:00:00+00:00')", [cid])
        old.db.execute("INSERT INTO messages (id, conversation_id, parent_id, role, content, created_at) "
                       "VALUES ('a', ?, 'u', 'assistant', 'old answer', '2026-01-01T00:00:01+00:00')", [cid])
        old.db.execute("UPDATE conversations SET active_leaf = 'a' WHERE id = ?", [cid])
        old.db.conn.commit()
    monkeypatch.undo()
    with HistoryStore(path) as s:
        assert s.schema_version == len(MIGRATIONS)
        assert [(m["content"], m["reasoning"]) for m in s.active_branch(cid)] == [("old question", ""),
                                                                               ("old answer", "")]
        assert [h["message_id"] for h in s.search("old answer")] == ["a"]  # the rebuilt index holds old rows
        s.add_message(cid, "assistant", "new answer", parent_id="u", reasoning="thought anew")
        assert len(s.search("anew")) == 1
        s.delete_message("a")
        assert s.search("old answer") == []  # the index's triggers follow deletes
    with HistoryStore(path) as again:  # reopening migrates nothing twice
        assert again.schema_version == len(MIGRATIONS) and len(again.search("anew")) == 1
