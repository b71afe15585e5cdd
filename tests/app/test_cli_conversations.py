"""`fucina chat --conversation` and `fucina conversations ...` over a temporary data dir."""

import errno
import io
import json
import sys

import pytest

from app.cli import main as fucina
from engine.platform import storage_errors
from engine.history import HistoryStore
from engine.kv import persist
from engine.platform.locks import conversation_lock

MODEL = "smollm2-135m-instruct"


@pytest.fixture
def home(tmp_path, monkeypatch, model_path):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    return str(model_path(MODEL))  # a path: the temporary data dir has no models


def chat(monkeypatch, capsys, model, conversation, *lines):
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))
    assert fucina(["chat", model, "--conversation", conversation, "--temp", "0", "--max-tokens", "12"]) == 0
    return capsys.readouterr()


def conversations(capsys, *args):
    code = fucina(["conversations", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_stored_chat_reopens_warm_and_is_listed_shown_and_found(home, monkeypatch, capsys, tmp_path):
    first = chat(monkeypatch, capsys, home, "new", "What is the capital of France?")
    assert "Paris" in first.out
    _, listed, _ = conversations(capsys, "list", "--json")
    [conv] = json.loads(listed)
    again = chat(monkeypatch, capsys, home, conv["id"][:6], "And of Italy?", "/stats")
    assert "resumed" in again.err and "2 messages" in again.err
    stats = again.out.splitlines()[-1]
    reused = int(stats.split("(")[1].split()[0])
    assert reused > 15  # the first turn came from the sidecar

    _, shown, _ = conversations(capsys, "show", conv["id"][:6])
    assert shown.index("What is the capital of France?") < shown.index("And of Italy?")
    _, found, _ = conversations(capsys, "search", "italy")
    assert conv["id"][:8] in found and "[Italy]" in found


def test_export_import_and_delete(home, monkeypatch, capsys, tmp_path):
    chat(monkeypatch, capsys, home, "new", "Hello")
    _, listed, _ = conversations(capsys, "list", "--json")
    cid = json.loads(listed)[0]["id"]
    exported = tmp_path / "c.json"
    assert conversations(capsys, "export", cid[:8], "--format", "json", "-o", str(exported))[0] == 0
    _, new_id, _ = conversations(capsys, "import", str(exported))
    _, md, _ = conversations(capsys, "export", new_id.strip())
    assert md.startswith("# Hello") and "## Assistant" in md

    sidecar = tmp_path / "sidecars" / f"{cid}.fkv"
    assert sidecar.exists()
    assert conversations(capsys, "delete", cid)[0] == 0
    assert not sidecar.exists()
    _, listed, _ = conversations(capsys, "list", "--json")
    assert [c["id"] for c in json.loads(listed)] == [new_id.strip()]


def test_bad_names_and_files_are_clear_errors(home, capsys, tmp_path):
    code, _, err = conversations(capsys, "show", "nope")
    assert code == 2 and "no conversation matches 'nope'" in err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = conversations(capsys, "import", str(bad))
    assert code == 2 and "cannot import" in err
    bad.write_text(json.dumps({"format": "something else"}))
    code, _, err = conversations(capsys, "import", str(bad))
    assert code == 2 and "error:" in err


@pytest.fixture
def empty_home(tmp_path, monkeypatch):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    return tmp_path


def an_export(**conversation):
    return {"format": "fucina-conversation", "version": 1, "conversation": {"model": "m", **conversation},
            "messages": [{"id": "1", "parent_id": None, "role": "user", "content": "hi"}]}


@pytest.mark.parametrize("text, expected", [
    (json.dumps(an_export(sampler={"ctx": "abc"})),
     "conversation.sampler.ctx: expected an integer between 16 and 131072, got 'abc'"),
    (json.dumps(an_export(pinned="false")), "conversation.pinned: expected true or false"),
    ("[" * 50_000 + "]" * 50_000, "nested too deeply"),
])
def test_a_malformed_import_is_one_error_line_and_writes_nothing(empty_home, capsys, text, expected):
    bad = empty_home / "bad.json"
    bad.write_text(text)
    code, _, err = conversations(capsys, "import", str(bad))
    assert code == 2 and err.startswith("error: ") and expected in err and len(err.splitlines()) == 1
    assert conversations(capsys, "list", "--json")[1].strip() == "[]"


def test_a_full_disk_is_one_error_line(empty_home, capsys, monkeypatch):
    import app.cli.conversations as cli_conversations

    def full_store():
        store = HistoryStore(HistoryStore.default_path())
        store.db.execute(f"PRAGMA max_page_count = {store.db.execute('PRAGMA page_count').fetchone()[0]}")
        return store

    monkeypatch.setattr(cli_conversations, "open_store", full_store)
    exported = empty_home / "c.json"
    exported.write_text(json.dumps({**an_export(), "messages": [
        {"id": str(i), "parent_id": None, "role": "user", "content": "x" * 10_000} for i in range(10)]}))
    code, _, err = conversations(capsys, "import", str(exported))
    assert code == 2 and err.startswith("error: cannot write ") and "history.db: database or disk is full" in err


def test_an_unusable_data_dir_is_one_error_line(empty_home, capsys):
    (empty_home / "history.db").mkdir()
    code, _, err = conversations(capsys, "list")
    assert code == 2 and err.startswith("error: cannot write ") and "history.db" in err


def stored_chat(monkeypatch, capsys, model, conversation, *lines):
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))
    code = fucina(["chat", model, "--conversation", conversation, "--temp", "0", "--max-tokens", "6"])
    return code, capsys.readouterr()


def test_a_chat_on_a_conversation_streaming_elsewhere_is_refused(home, monkeypatch, capsys, tmp_path):
    stored_chat(monkeypatch, capsys, home, "new", "Hello")
    [conv] = HistoryStore(tmp_path / "history.db").list_conversations()
    streaming = conversation_lock(tmp_path / "history.db", conv["id"])  # what a turn in the app holds
    assert streaming.try_acquire()
    code, out = stored_chat(monkeypatch, capsys, home, conv["id"], "Me too")
    assert code == 2 and out.err.strip().endswith(f"error: conversation {conv['id'][:8]} is busy: a reply is "
                                                  "being written into it by another Fucina window or command; "
                                                  "try again when that reply has ended")
    streaming.release()
    assert len(HistoryStore(tmp_path / "history.db").active_branch(conv["id"])) == 2  # "Me too" not stored


def test_a_reply_the_disk_refuses_is_reported_and_fails_the_chat(home, monkeypatch, capsys):
    add_message = HistoryStore.add_message

    def refuse_replies(self, conversation_id, role, content, *args, **kwargs):
        if role == "assistant":
            raise storage_errors.full(self.path, "database or disk is full")
        return add_message(self, conversation_id, role, content, *args, **kwargs)

    monkeypatch.setattr(HistoryStore, "add_message", refuse_replies)
    code, out = stored_chat(monkeypatch, capsys, home, "new", "Hello", "Again", "/reset")
    errors = [line for line in out.err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(out.out.strip().splitlines()) == 1  # the reply was shown; "Again" was not sent
    assert "(not reset: the last reply was not saved" in out.err
    assert "database or disk is full" in errors[0] and "the reply above is kept" in errors[0]
    assert "the message was not sent" in errors[1]  # saving the pending reply first failed again
    assert errors[2].startswith("error: the last reply was not saved (it is shown above): cannot write")


def test_a_failed_sidecar_write_is_a_warning(home, monkeypatch, capsys):
    def disk_full(path, update):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(persist, "apply", disk_full)
    code, out = stored_chat(monkeypatch, capsys, home, "new", "Hello", "Again")
    warnings = [line for line in out.err.splitlines() if line.startswith("warning: ")]
    # each write failed: the fresh sidecar at open (told after turn 1), turn 1 (after turn 2), turn 2 (at exit)
    assert code == 0 and len(warnings) == 3
    assert all("could not write the sidecar" in w and "No space left on device" in w for w in warnings)


def test_an_export_to_an_unwritable_place_is_one_error_line(empty_home, capsys):
    HistoryStore(HistoryStore.default_path()).create_conversation("m")
    _, listed, _ = conversations(capsys, "list", "--json")
    target = empty_home / "no such folder" / "c.md"
    code, _, err = conversations(capsys, "export", json.loads(listed)[0]["id"], "-o", str(target))
    assert code == 2 and err == f"error: cannot write {target}: No such file or directory\n"


@pytest.mark.parametrize("policy", ["drop_oldest", "stop"])
def test_an_imported_message_too_big_for_the_context_is_left_out_or_refused(home, monkeypatch, capsys, tmp_path,
                                                                             policy):
    export = {"format": "fucina-conversation", "version": 1,
              # a stored chat replies with its own settings (the command line's apply to new chats): greedy
              "conversation": {"model": "m.gguf", "sampler": {"ctx": 512, "context_policy": policy,
                                                              "temperature": 0, "max_tokens": 12},
                               "active_leaf": "a"},
              "messages": [{"id": "u", "parent_id": None, "role": "user", "content": "imported " * 1_000_000},
                           {"id": "a", "parent_id": "u", "role": "assistant", "content": "ok"}]}
    (tmp_path / "big.json").write_text(json.dumps(export))
    _, cid, _ = conversations(capsys, "import", str(tmp_path / "big.json"))
    out = chat(monkeypatch, capsys, home, cid.strip(), "What is the capital of France?")
    if policy == "drop_oldest":
        assert "Paris" in out.out and "context full: the 1 oldest turn left out" in out.err
    else:
        assert out.out == "" and "the conversation needs at least" in out.err and "context policy: stop" in out.err


def test_a_search_without_hits_says_so(empty_home, capsys):
    assert fucina(["conversations", "search", "nothing", "here"]) in (0, None)
    assert capsys.readouterr().out == "no message contains every word of: nothing here\n"
