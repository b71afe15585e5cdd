"""`fucina chat --conversation` and `fucina conversations ...` over a temporary data dir."""

import io
import json
import sys

import pytest

from app.cli import main as fucina

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


@pytest.mark.parametrize("policy", ["drop_oldest", "stop"])
def test_an_imported_message_too_big_for_the_context_is_left_out_or_refused(home, monkeypatch, capsys, tmp_path,
                                                                             policy):
    export = {"format": "fucina-conversation", "version": 1,
              "conversation": {"model": "m.gguf", "sampler": {"ctx": 512, "context_policy": policy},
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
