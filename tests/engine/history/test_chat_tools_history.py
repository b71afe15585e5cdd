"""A conversation's own tool setting (the tools on in it and their choice): stored, read back, checked, kept by
export and import, and added to databases made before it (schema 5) as NULL, the app's defaults."""

import pytest

from engine.errors import HistoryError
from engine.history import HistoryStore
from engine.history.schema import MIGRATIONS
from tests.engine.history.conftest import old_conversation

TOOLS = {"enabled": ["weather__get_weather", "read_file"], "choice": "required"}


@pytest.fixture
def store(tmp_path):
    with HistoryStore(tmp_path / "history.db") as s:
        yield s


def test_a_version_4_database_keeps_its_chats_and_gains_their_tool_setting(tmp_path, monkeypatch):
    import engine.history.store as history_store

    path = tmp_path / "h.db"
    monkeypatch.setattr(history_store, "MIGRATIONS", MIGRATIONS[:4])
    with HistoryStore(path) as old:
        assert "tools" not in {c.name for c in old.db["conversations"].columns}
        cid = old_conversation(old.db)
        old.add_message(cid, "user", "kept")
    monkeypatch.undo()
    with HistoryStore(path) as s:
        assert s.schema_version == len(MIGRATIONS) == 5
        assert s.get_conversation(cid)["tools"] is None  # the app's defaults, as before
        assert [m["content"] for m in s.active_branch(cid)] == ["kept"]
        s.db.execute("DELETE FROM schema_version WHERE version = 5")  # a crash before the version row
        s.db.conn.commit()
    with HistoryStore(path) as again:  # the column is there already: the migration re-runs without failing
        assert again.schema_version == 5 and again.get_conversation(cid)["tools"] is None


def test_a_chat_keeps_its_own_tools_until_they_are_cleared(store):
    cid = store.create_conversation("m")
    assert store.get_conversation(cid)["tools"] is None
    store.update_settings(cid, tools=TOOLS)
    conv = store.get_conversation(cid)
    assert conv["tools"] == {"enabled": ["read_file", "weather__get_weather"], "choice": "required"}
    store.update_settings(cid, system_prompt="Be brief")  # other settings leave it be
    assert store.get_conversation(cid)["tools"] == conv["tools"]
    store.update_settings(cid, tools=None)
    assert store.get_conversation(cid)["tools"] is None
    made = store.create_conversation("m", tools={"enabled": [], "choice": "none"})
    assert store.list_conversations()[0]["tools"] == {"enabled": [], "choice": "none"}
    assert store.get_conversation(made)["tools"]["choice"] == "none"


@pytest.mark.parametrize("tools, error", [
    ("read_file", r"tools: expected an object of enabled, choice"),
    ({"enabled": ["read_file"]}, r"tools: expected an object of enabled, choice"),
    ({"enabled": "read_file", "choice": "auto"}, r"tools\.enabled: expected a list of tool names"),
    ({"enabled": ["read_file", 3], "choice": "auto"}, r"tools\.enabled\[1\]: expected a string"),
    ({"enabled": [], "choice": None}, r"tools\.choice: expected a string"),
    ({"enabled": [], "choice": ""}, r"tools\.choice: expected auto, required, none or a tool's name"),
])
def test_a_tool_setting_not_of_that_shape_is_refused(store, tools, error):
    cid = store.create_conversation("m")
    with pytest.raises(HistoryError, match=error):
        store.update_settings(cid, tools=tools)
    assert store.get_conversation(cid)["tools"] is None
    with pytest.raises(HistoryError, match=error):
        store.create_conversation("m", tools=tools)


def test_export_and_import_keep_a_chats_tools_and_an_older_export_has_none(store):
    cid = store.create_conversation("m", tools=TOOLS)
    store.add_message(cid, "user", "Weather?")
    exported = store.export_json(cid)
    assert exported["conversation"]["tools"]["choice"] == "required"
    copy = store.import_json(exported)
    assert store.get_conversation(copy)["tools"] == store.get_conversation(cid)["tools"]
    del exported["conversation"]["tools"]  # as an export made before chats had their own tools
    assert store.get_conversation(store.import_json(exported))["tools"] is None
    exported["conversation"]["tools"] = {"enabled": "all", "choice": "auto"}
    with pytest.raises(HistoryError, match=r"conversation\.tools\.enabled"):
        store.import_json(exported)
