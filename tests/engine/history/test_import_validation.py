"""An imported document is checked whole before anything is written; errors name the JSON path. The same
sampler checks guard settings set from the app or the CLI."""

import json

import pytest

from engine.errors import HistoryError
from engine.history import HistoryStore
from engine.history.validate import read_export


@pytest.fixture
def store(tmp_path):
    with HistoryStore(tmp_path / "history.db") as s:
        yield s


@pytest.fixture
def export(store):
    cid = store.create_conversation("m", sampler={"temperature": 0.5})
    store.add_message(cid, "user", "q")
    store.add_message(cid, "assistant", "a", meta={"generated_tokens": 1})
    return json.loads(json.dumps(store.export_json(cid)))


def conversation(**fields):
    return lambda d: d["conversation"].update(fields)


def sampler(**fields):
    return lambda d: d["conversation"]["sampler"].update(fields)


def message(i, **fields):
    return lambda d: d["messages"][i].update(fields)


def nested(depth):
    value = {}
    for _ in range(depth):
        value = {"x": value}
    return value


@pytest.mark.parametrize("mutate, expected", [
    (sampler(ctx="abc"), "conversation.sampler.ctx: expected an integer between 16 and 131072, got 'abc'"),
    (sampler(ctx=10**12), "conversation.sampler.ctx: expected an integer between 16 and 131072, got 1000000000000"),
    (sampler(ctx=4096.5), "conversation.sampler.ctx: expected an integer"),
    (sampler(temperature="hot"), "conversation.sampler.temperature: expected a number between 0 and 10, got 'hot'"),
    (sampler(temperature=float("nan")), "conversation.sampler.temperature: expected a number"),
    (sampler(top_p=True), "conversation.sampler.top_p: expected a number between 0 and 1, got True"),
    (sampler(seed=-1), "conversation.sampler.seed: expected an integer"),
    (sampler(temprature=1), "conversation.sampler: unknown sampler setting(s) temprature"),
    (conversation(sampler=[1]), "conversation.sampler: expected an object"),
    (conversation(pinned="false"), "conversation.pinned: expected true or false, got 'false'"),
    (conversation(title={"a": 1}), "conversation.title: expected a string, got {'a': 1}"),
    (conversation(model=None), "conversation.model: expected a string, got None"),
    (conversation(active_leaf=["x"]), "conversation.active_leaf: expected a string"),
    (lambda d: d.update(version=True), "version: unsupported export version True"),
    (message(0, id=["unhashable"]), "messages[0].id: expected a string, got ['unhashable']"),
    (message(1, parent_id={"a": 1}), "messages[1].parent_id: expected a string, got {'a': 1}"),
    (message(1, content="bad \ud800 text"), r"messages[1].content: contains a lone surrogate '\ud800' at character 4"),
    (message(1, content=None), "messages[1].content: expected a string"),
    (message(1, meta=nested(40)), "messages[1].meta.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x: nested deeper than 16"),
    (message(1, meta={"k": "\udfff"}), "messages[1].meta.k: contains a lone surrogate"),
    (message(1, role=["user"]), "messages[1].role: expected one of system, user, assistant"),
    (lambda d: d["messages"].append(7), "messages[2]: expected an object, got 7"),
])
def test_a_malformed_field_is_refused_by_its_path_and_nothing_is_written(store, export, mutate, expected):
    mutate(export)
    with pytest.raises(HistoryError) as raised:
        store.import_json(export)
    message_text = str(raised.value)
    assert message_text.startswith("cannot import conversation: ")
    assert expected in message_text
    assert len(store.list_conversations()) == 1


def test_a_valid_document_imports_with_its_values_normalised(store, export):
    export["conversation"].update(pinned=True, sampler={"ctx": 4096.0, "temperature": 1, "seed": None})
    cid = store.import_json(export)
    conv = store.get_conversation(cid)
    assert conv["pinned"] is True
    assert conv["sampler"] == {"ctx": 4096, "temperature": 1.0, "seed": None}
    assert [m["content"] for m in store.active_branch(cid)] == ["q", "a"]


def test_settings_set_from_the_app_or_cli_pass_the_same_checks(store):
    cid = store.create_conversation("m")
    with pytest.raises(HistoryError, match=r"^sampler.ctx: expected an integer between 16 and 131072"):
        store.update_settings(cid, sampler={"ctx": 10**12})
    with pytest.raises(HistoryError, match=r"^sampler.temperature: expected a number"):
        store.create_conversation("m", sampler={"temperature": "hot"})
    with pytest.raises(HistoryError, match="title: expected a string"):
        store.rename(cid, {"a": 1})
    with pytest.raises(HistoryError, match="message content: contains a lone surrogate"):
        store.add_message(cid, "user", "typed \udcff on a terminal")  # what surrogateescape makes of bad bytes
    assert store.get_conversation(cid)["sampler"] == {} and store.active_branch(cid) == []


@pytest.mark.parametrize("text, expected", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("{not json", "Expecting property name"),
    ('{"n": ' + "9" * 5000 + "}", "Exceeds the limit"),
])
def test_an_unreadable_file_is_refused(tmp_path, text, expected):
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(HistoryError, match=expected):
        read_export(path)
