"""Tool calls in the history: a reply's calls and the tool messages answering them are stored with the
conversation, found by search, kept by export and import, and added to databases made before them
(schema 4) without losing their chats."""

import json
import re

import pytest
import sqlite_utils

from engine.errors import HistoryError
from engine.history import HistoryStore
from engine.history.schema import MIGRATIONS
from tests.engine.history.conftest import old_conversation

CALL = {"id": "call_1", "name": "get_weather", "arguments": {"city": "Reykjavik"}}
RESULT = {"call_id": "call_1", "name": "get_weather", "is_error": False, "seconds": 0.25}


@pytest.fixture
def store(tmp_path):
    with HistoryStore(tmp_path / "history.db") as s:
        yield s


def chat_with_a_tool_call(store):
    cid = store.create_conversation("m.gguf")
    store.add_message(cid, "user", "What is the weather?")
    store.add_message(cid, "assistant", "", tool_calls=[CALL])
    store.add_message(cid, "tool", "Drizzle and 4 degrees", tool_result=RESULT)
    store.add_message(cid, "assistant", "It drizzles.")
    return cid


def test_calls_and_results_are_stored_in_the_branch(store):
    cid = chat_with_a_tool_call(store)
    user, calling, tool, answer = store.active_branch(cid)
    assert calling["tool_calls"] == [CALL] and calling["tool_result"] is None
    assert (tool["role"], tool["content"], tool["tool_result"]) == ("tool", "Drizzle and 4 degrees", RESULT)
    assert user["tool_calls"] == [] and answer["tool_result"] is None


def test_search_finds_a_tool_result_and_a_call_argument(store):
    cid = chat_with_a_tool_call(store)
    tool, calling = store.active_branch(cid)[2], store.active_branch(cid)[1]
    [hit] = store.search("drizzle and degrees")
    assert hit["message_id"] == tool["id"] and "[Drizzle]" in hit["snippet"]
    assert [h["message_id"] for h in store.search("Reykjavik")] == [calling["id"]]


def test_export_and_import_keep_calls_and_results(store):
    cid = chat_with_a_tool_call(store)
    data = json.loads(json.dumps(store.export_json(cid)))  # through JSON text, as a file is
    assert data["version"] == 2
    assert [m.get("tool_calls") for m in data["messages"]] == [None, [CALL], None, None]
    copy = store.import_json(data)
    assert [(m["role"], m["content"], m["tool_calls"], m["tool_result"]) for m in store.active_branch(copy)] == [
        (m["role"], m["content"], m["tool_calls"], m["tool_result"]) for m in store.active_branch(cid)]
    markdown = store.export_markdown(cid)
    assert "Tool call: `get_weather(" in markdown and "## Tool result: get_weather" in markdown


@pytest.mark.parametrize("change, error", [
    (lambda ms: ms[1].update(tool_calls=[{"id": "c", "name": "f", "arguments": "{}"}]),
     "messages[1].tool_calls[0].arguments: expected an object"),
    (lambda ms: ms[0].update(tool_calls=[CALL]), "only an assistant message makes tool calls"),
    (lambda ms: ms[2].pop("tool_result"), "messages[2].tool_result: expected an object"),
    (lambda ms: ms[2]["tool_result"].update(seconds=-1), "messages[2].tool_result.seconds"),
    (lambda ms: ms[3].update(tool_result=RESULT), "only a tool message carries one"),
])
def test_an_import_with_broken_tool_parts_is_refused_whole(store, change, error):
    data = store.export_json(chat_with_a_tool_call(store))
    change(data["messages"])
    with pytest.raises(HistoryError, match=re.escape(error)):
        store.import_json(data)
    assert len(store.list_conversations()) == 1


def test_a_tool_message_needs_its_result_details(store):
    cid = store.create_conversation("m")
    with pytest.raises(HistoryError, match="tool_result"):
        store.add_message(cid, "tool", "orphan")


def test_a_version_3_database_keeps_its_chats_and_gains_tool_messages(tmp_path, monkeypatch):
    import engine.history.store as history_store

    path = tmp_path / "h.db"
    monkeypatch.setattr(history_store, "MIGRATIONS", MIGRATIONS[:3])
    with HistoryStore(path) as old:
        assert "tool_calls" not in {c.name for c in old.db["messages"].columns}
        cid = old_conversation(old.db)
        old.db.execute("INSERT INTO messages (id, conversation_id, parent_id, role, content, created_at, reasoning) "
                       "VALUES ('u', ?, NULL, 'user', 'old question', '2026-01-01T00:00:00+00:00', '')", [cid])
        old.db.execute("INSERT INTO messages (id, conversation_id, parent_id, role, content, created_at, reasoning) "
                       "VALUES ('a', ?, 'u', 'assistant', 'old answer', '2026-01-01T00:00:01+00:00', 'mulled')", [cid])
        old.db.execute("UPDATE conversations SET active_leaf = 'a' WHERE id = ?", [cid])
        old.db.conn.commit()
    monkeypatch.undo()
    with HistoryStore(path) as s:
        assert s.schema_version == len(MIGRATIONS)
        assert [(m["content"], m["reasoning"], m["tool_calls"]) for m in s.active_branch(cid)] == [
            ("old question", "", []), ("old answer", "mulled", [])]
        assert [h["message_id"] for h in s.search("mulled")] == ["a"]  # the rebuilt index holds old rows
        s.add_message(cid, "assistant", "", parent_id="u", tool_calls=[CALL])
        s.add_message(cid, "tool", "sunny", tool_result=RESULT)
        assert len(s.search("sunny")) == 1
        s.delete_message("u")  # the rebuilt table still cascades to the replies
        assert s.search("sunny") == [] and s.active_branch(cid) == []
        assert s.db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    with HistoryStore(path) as again:  # reopening migrates nothing twice
        assert again.schema_version == len(MIGRATIONS)


def test_a_migration_interrupted_after_the_rebuild_runs_again(tmp_path):
    """A crash after the table was rebuilt but before its version row: the next open finishes the job."""
    path = tmp_path / "h.db"
    with HistoryStore(path) as s:
        cid = chat_with_a_tool_call(s)
        s.db.execute("DELETE FROM schema_version WHERE version >= 4")
        s.db.conn.commit()
    with HistoryStore(path) as s:
        assert s.schema_version == len(MIGRATIONS)
        assert len(s.active_branch(cid)) == 4 and len(s.search("drizzle")) == 1


def test_a_rebuild_that_fails_midway_leaves_the_old_table(tmp_path, monkeypatch):
    """The rebuild is one transaction: a statement failing inside it (here the new table's name is taken)
    rolls everything back, and once the cause is gone the next open migrates with every message kept."""
    import engine.history.store as history_store

    path = tmp_path / "h.db"
    monkeypatch.setattr(history_store, "MIGRATIONS", MIGRATIONS[:3])
    with HistoryStore(path) as old:
        cid = old_conversation(old.db)
        old.db.execute("INSERT INTO messages (id, conversation_id, parent_id, role, content, created_at, reasoning) "
                       "VALUES ('u', ?, NULL, 'user', 'kept through a failed migration', '2026-01-01', '')", [cid])
        old.db.execute("UPDATE conversations SET active_leaf = 'u' WHERE id = ?", [cid])
        old.db.execute("CREATE TABLE messages_v4 (x)")
        old.db.conn.commit()
    monkeypatch.undo()
    with pytest.raises(Exception, match="messages_v4"):
        HistoryStore(path)
    raw = sqlite_utils.Database(path)  # the file as it is, without migrating
    assert "tool_calls" not in {c.name for c in raw["messages"].columns}
    raw.execute("DROP TABLE messages_v4")
    raw.conn.commit()
    raw.close()
    with HistoryStore(path) as s:
        assert s.schema_version == len(MIGRATIONS)
        assert [m["content"] for m in s.active_branch(cid)] == ["kept through a failed migration"]
