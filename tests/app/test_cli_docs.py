"""`fucina docs add | list | remove` and `--attach` on `chat` and `generate`: a document read once is
loaded the next time, bad files give one error line, and a real model answers from an attached document."""

import io
import json
import sys

import pytest

from app.cli import main as fucina


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A tiny random model carrying the byte-level ChatML tokenizer, with a 4096-token context."""
    from tests.engine.chat.conftest import write_tiny_chatml_model

    return str(write_tiny_chatml_model(tmp_path_factory.mktemp("docs") / "tiny.gguf", 4096))


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def generate(capsys, model, *flags):
    assert fucina(["generate", model, "--chat", "--prompt", "Which day?", "--max-tokens", "4", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_document_is_read_once_then_loaded_and_listed_and_removed(tiny_gguf, home, tmp_path, capsys):
    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\nThe meeting moved to Thursday at noon.\n")
    assert fucina(["docs", "add", str(doc), "--model", tiny_gguf]) == 0
    assert "notes.md:" in capsys.readouterr().out
    first = generate(capsys, tiny_gguf, "--attach", str(doc))
    [a] = first["attachments"]
    assert not a["built"] and a["name"] == "notes.md" and a["tokens"] > 20  # docs add built it
    assert fucina(["docs", "list"]) == 0
    listed = capsys.readouterr().out
    assert a["id"] in listed and "notes.md" in listed
    assert fucina(["docs", "remove", a["id"][:10]]) == 0
    capsys.readouterr()
    rebuilt = generate(capsys, tiny_gguf, "--attach", str(doc))
    assert rebuilt["attachments"][0]["built"]  # removed: read again
    assert (rebuilt["ids"], rebuilt["prompt_ids"]) == (first["ids"], first["prompt_ids"])  # load == build


def test_a_stored_chat_reopens_warm_behind_its_recorded_documents(tiny_gguf, home, tmp_path, monkeypatch, capsys):
    import re

    doc = tmp_path / "notes.txt"
    doc.write_text("Thursday at noon.")

    def chat(conversation, *flags, lines="hi\n", code=0):
        monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
        assert fucina(["chat", tiny_gguf, "--max-tokens", "3", "--temp", "0", "--conversation", conversation,
                       *flags]) == code
        return capsys.readouterr()

    uninterrupted = chat("new", "--attach", str(doc), lines="hi\nmore\n").out
    first = chat("new", "--attach", str(doc))
    conversation = re.search(r"\(conversation (\w+):", first.err).group(1)
    reopened = chat(conversation, lines="more\n")  # its document is stored with it: no --attach
    assert "resumed" in reopened.err and "attached notes.txt" in reopened.err
    assert first.out + reopened.out == uninterrupted  # the reopened chat goes on as the uninterrupted one
    assert "resumed" in chat(conversation, "--attach", str(doc)).err  # naming the same document again is fine
    other = tmp_path / "other.txt"
    other.write_text("Friday.")
    refused = chat(conversation, "--attach", str(other), code=2).err
    assert "already has turns" in refused and "--conversation new --attach" in refused
    restarted = re.search(r"\(new conversation (\w+)\)", chat(conversation, lines="/reset\n").err).group(1)
    assert "attached notes.txt" in chat(restarted).err  # starting over keeps the chat's documents
    for path in (home / "cartridges").glob("*"):
        path.unlink()
    doc.unlink()
    gone = chat(conversation).err  # the document cannot come back: said, and the chat goes on without it
    assert "warning: notes.txt was left out" in gone and "resumed" not in gone


def test_a_damaged_cartridge_is_reported_and_read_again(tiny_gguf, home, tmp_path, capsys):
    doc = tmp_path / "notes.txt"
    doc.write_text("Thursday at noon.")
    first = generate(capsys, tiny_gguf, "--attach", str(doc))
    [stored] = (home / "cartridges").glob("*.safetensors")
    stored.write_bytes(stored.read_bytes()[:-64])
    again = fucina(["generate", tiny_gguf, "--chat", "--prompt", "Which day?", "--max-tokens", "4", "--json",
                    "--attach", str(doc)])
    out = capsys.readouterr()
    assert again == 0 and "warning: the cartridge" in out.err and "damaged" in out.err
    assert json.loads(out.out)["ids"] == first["ids"]


def _encrypted_pdf(path):
    from pypdf import PdfWriter

    w = PdfWriter()
    w.add_blank_page(100, 100)
    w.encrypt("pw", algorithm="RC4-128")
    w.write(str(path))


@pytest.mark.parametrize("make, words", [
    (lambda p: _encrypted_pdf(p / "x.pdf"), "password-protected PDF"),
    (lambda p: (p / "x.bin").write_bytes(bytes(range(256)) * 4), "binary file"),
    (lambda p: (p / "x.txt").write_bytes(b""), "zero-byte"),
    (lambda p: (p / "x.txt").write_bytes(b"\xff\xfe\x00"), "not text in any encoding"),  # torn UTF-16
])
def test_a_bad_file_is_one_error_line_and_exit_2(tiny_gguf, home, tmp_path, capsys, make, words):
    (tmp_path / "docs").mkdir()
    make(tmp_path / "docs")
    [path] = (tmp_path / "docs").iterdir()
    assert fucina(["generate", tiny_gguf, "--chat", "--prompt", "q", "--attach", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and words in err[0] and str(path) in err[0]


def test_attach_needs_a_chat_prompt(tiny_gguf, home, tmp_path, capsys):
    (tmp_path / "d.txt").write_text("text")
    assert fucina(["generate", tiny_gguf, "--prompt", "q", "--attach", str(tmp_path / "d.txt")]) == 2
    assert "add --chat" in capsys.readouterr().err
    assert fucina(["docs", "remove", "nothing"]) == 2
    assert "no stored document" in capsys.readouterr().err


def test_a_real_model_answers_from_the_attached_document_in_a_chat(model_path, home, tmp_path, monkeypatch,
                                                                    capsys):
    model = str(model_path("smollm2-135m-instruct"))
    doc = tmp_path / "memo.txt"
    doc.write_text("Internal memo. The warehouse door code is 4417. Deliveries arrive on Tuesdays.\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO("What is the warehouse door code?\n"))
    assert fucina(["chat", model, "--temp", "0", "--max-tokens", "24", "--attach", str(doc)]) == 0
    out = capsys.readouterr()
    assert "4417" in out.out and "attached memo.txt" in out.err


LONG = "".join(f"Room {i} is painted {['red', 'blue', 'green'][i % 3]} and seats {i + 4} people.\n\n"
               for i in range(30))


def test_a_document_over_the_budget_is_served_by_the_parts_that_fit_and_reports_them(tiny_gguf, home, tmp_path,
                                                                                      capsys):
    doc = tmp_path / "rooms.txt"
    doc.write_text(LONG)
    first = generate(capsys, tiny_gguf, "--attach", str(doc), "--doc-budget", "900")
    parts = first["attachments"]
    assert 1 <= len(parts) <= 3 and sum(p["tokens"] for p in parts) <= 900
    assert [p["chunk"] for p in parts] == sorted(p["chunk"] for p in parts)
    assert all("rooms.txt [part" in p["name"] for p in parts)
    again = generate(capsys, tiny_gguf, "--attach", str(doc), "--doc-budget", "900")
    assert [p["id"] for p in again["attachments"]] == [p["id"] for p in parts]
    assert not any(p["built"] for p in again["attachments"]) and again["ids"] == first["ids"]
    small = generate(capsys, tiny_gguf, "--attach", str(doc), "--doc-budget", "100000")  # fits whole: one cartridge
    assert [p["chunk"] for p in small["attachments"]] == [None]


def test_a_chat_serves_a_long_document_by_the_parts_its_first_message_matches(tiny_gguf, home, tmp_path,
                                                                             monkeypatch, capsys):
    doc = tmp_path / "rooms.txt"
    doc.write_text(LONG)
    monkeypatch.setattr(sys, "stdin", io.StringIO("Which colour is room 7?\nAnd room 8?\n"))
    assert fucina(["chat", tiny_gguf, "--max-tokens", "3", "--doc-budget", "900", "--attach", str(doc)]) == 0
    err = capsys.readouterr().err
    assert "the parts that match the question are served" in err
    assert "(attached rooms.txt [part" in err and "chosen for the question" in err
