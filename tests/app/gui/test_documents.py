"""Documents in the window, on a tiny random model: a dropped file becomes a chip (reading, then ready) whose
tokens the status line counts, the chat records it and reopens behind it, a chat with turns makes way for a
new one, a chip's x removes it or stops its reading, bad files fail their chip and leave the chat usable,
and the Documents library lists and deletes cartridges."""

import pytest
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication

from app.gui.document_jobs import FAILED, READING, READY, Chip
from engine.cartridge.store import delete, stored
from tests.app.gui.conftest import TURN_TIMEOUT_MS
from tests.app.test_cli_docs import _encrypted_pdf

GREEDY = {"system_prompt": None, "sampler": {"temperature": 0.0, "max_tokens": 3}}
TEXT = "".join(f"Item {i} weighs {i * 7 % 13} grams.\n" for i in range(30))  # two prefill slices


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tests.engine.chat.conftest import write_tiny_chatml_model

    return write_tiny_chatml_model(tmp_path_factory.mktemp("gui-docs") / "tiny.gguf", 4096)


@pytest.fixture
def gui_model(tiny_model):
    return tiny_model


@pytest.fixture
def window(open_window):
    """Factory: a main window on a fresh data directory, the tiny model loaded."""
    return open_window


def drop(window, *paths):
    """Drag the files over the window and drop them, as a file manager does."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    for event in (QDragEnterEvent(QPoint(50, 50), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                                  Qt.KeyboardModifier.NoModifier),
                  QDropEvent(QPointF(50, 50), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                             Qt.KeyboardModifier.NoModifier)):
        QApplication.sendEvent(window, event)
        assert event.isAccepted()


def chips(window):
    return [w.chip for w in window.attachment_bar.chips]


def settled(qtbot, window, count=1):
    qtbot.waitUntil(lambda: len(chips(window)) == count and all(c.state != READING for c in chips(window)),
                    timeout=TURN_TIMEOUT_MS)
    return chips(window)


def send(qtbot, window, text):
    window.composer.input.setPlainText(text)
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not window.streaming, timeout=TURN_TIMEOUT_MS)


def test_a_dropped_document_is_read_counted_recorded_and_attached_again_when_the_chat_reopens(
        qtbot, window, tmp_path):
    doc = tmp_path / "facts.md"
    doc.write_text(TEXT)
    w = window()
    w.apply_settings(GREEDY)
    seen = []
    w.client.worker.documents.chips_changed.connect(lambda c: seen.extend(c))  # on the worker thread
    drop(w, doc)
    [chip] = settled(qtbot, w)
    assert chip.state == READY and chip.name == "facts.md" and chip.tokens > 0
    assert any(c.state == READING and 0 < c.percent < 100 for c in seen)  # "reading N%" on the way
    assert f"{chip.tokens:,} tokens" in w.attachment_bar.chips[0].label.text()
    qtbot.waitUntil(lambda: f"({chip.tokens:,} in documents)" in w.status_line.text())
    send(qtbot, w, "What does item 3 weigh?")
    assert w.current_id is not None and [c.state for c in chips(w)] == [READY]
    assert f"({chip.tokens:,} in documents)" in w.status_line.text()
    conversation = w.current_id
    w.close()

    reopened = window(conversation)
    [again] = settled(qtbot, reopened)
    assert (again.name, again.state, again.tokens, again.reason) == ("facts.md", READY, chip.tokens, "")
    qtbot.waitUntil(lambda: "resumed warm" in reopened.status_line.text())
    reopened.close()

    for cartridge in stored():
        delete(cartridge)
    doc.unlink()
    gone = window(conversation)  # nothing to attach it from: the chip says so, and the chat goes on without it
    [left_out] = settled(qtbot, gone)
    assert left_out.state == FAILED and "facts.md was left out" in left_out.reason
    send(qtbot, gone, "And item 4?")
    assert gone.chat_model.messages[-1]["role"] == "assistant"
    gone.close()


def test_a_chat_with_turns_makes_way_for_a_new_one_and_a_chips_x_removes_or_stops_it(qtbot, window, tmp_path):
    doc = tmp_path / "notes.txt"
    doc.write_text(TEXT)
    w = window()
    w.apply_settings(GREEDY)
    send(qtbot, w, "hi")
    assert w.current_id is not None
    w.attach_files([str(doc)])
    assert w.current_id is None and not w.chat_model.messages  # a new chat, which says why
    assert "new chat was started for notes.txt" in w.attachment_bar.notice.text()
    [chip] = settled(qtbot, w)
    assert chip.state == READY
    qtbot.mouseClick(w.attachment_bar.chips[0].close_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not chips(w))
    qtbot.waitUntil(lambda: "in documents" not in w.status_line.text())

    other = tmp_path / "other.txt"
    other.write_text(TEXT + "More.\n")
    seen = []
    w.client.worker.documents.chips_changed.connect(lambda c: seen.append([x.name for x in c]))
    key = w.documents.attach(str(other))
    w.documents.remove(Chip(key, "other.txt", READING))  # stopped before its first slice
    qtbot.waitUntil(lambda: seen[-2:] == [["other.txt"], []], timeout=TURN_TIMEOUT_MS)
    assert not chips(w)
    send(qtbot, w, "still fine?")
    assert w.current_id is not None and w.store.attachments(w.current_id) == []
    w.close()


def test_bad_files_fail_their_chip_with_the_reason_and_the_chat_stays_usable(qtbot, window, tmp_path, tiny_model):
    from engine.cartridge.build import build
    from engine.cartridge.ingest import Document
    from engine.cartridge.store import save
    from engine.chat import template_for_model
    from engine.tokenize import load_tokenizer
    from tests.engine.chat.conftest import write_tiny_chatml_model
    from engine.models import load_model

    foreign_model = load_model(write_tiny_chatml_model(tmp_path / "other.gguf", 2048))
    tok = load_tokenizer(foreign_model.file.metadata)
    foreign = save(build(foreign_model, tok, template_for_model(foreign_model.file.metadata, tok),
                         Document("f.txt", "text", "foreign rows")), tmp_path / "foreign")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(foreign.read_bytes()[:200])
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "x.bin").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "torn.txt").write_bytes(b"\xff\xfe\x00")
    _encrypted_pdf(tmp_path / "locked.pdf")
    (tmp_path / "long.txt").write_text(TEXT)
    bad = {"empty.txt": "zero-byte", "x.bin": "binary file", "torn.txt": "not text in any encoding",
           "locked.pdf": "password-protected PDF", foreign.name: "built for another model",
           "truncated.safetensors": "damaged", "long.txt": "too small to serve it in parts"}
    w = window()
    w.apply_settings({**GREEDY, "sampler": {**GREEDY["sampler"], "ctx": 512}})  # too small even for its parts
    drop(w, *[foreign if name == foreign.name else tmp_path / name for name in bad])
    shown = settled(qtbot, w, len(bad))
    assert {c.name: c.state for c in shown} == dict.fromkeys(bad, FAILED)
    for c in shown:
        assert bad[c.name] in c.reason, c.reason
    assert "failed — " in w.attachment_bar.chips[0].label.text()
    send(qtbot, w, "hi")  # the chat goes on, behind no document
    assert w.chat_model.messages[-1]["role"] == "assistant"
    assert w.store.attachments(w.current_id) == []
    w.close()


def test_the_documents_library_lists_cartridges_and_deletes_them(qtbot, window, tmp_path, monkeypatch):
    import app.gui.main_window
    doc = tmp_path / "facts.md"
    doc.write_text(TEXT)
    monkeypatch.setattr(app.gui.main_window, "choose_documents", lambda parent: [str(doc)])  # the file dialog
    w = window()
    qtbot.mouseClick(w.attach_button, Qt.MouseButton.LeftButton)  # the paperclip
    [chip] = settled(qtbot, w)
    dialog = w.open_documents()
    assert dialog.table.rowCount() == 1
    cells = [dialog.table.item(0, j).text() for j in range(dialog.table.columnCount())]
    assert cells[:3] == ["facts.md", "tiny.gguf", f"{chip.tokens:,}"] and cells[3].endswith("MiB")
    dialog.table.selectRow(0)
    qtbot.mouseClick(dialog.delete_button, Qt.MouseButton.LeftButton)
    assert dialog.table.rowCount() == 0 and stored() == []
    dialog.close()
    w.close()


def test_the_disk_budget_setting_evicts_the_least_recently_used_cartridges(qtbot, window, tmp_path):
    w = window()
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text(f"{name} " + TEXT)
        w.attach_files([str(tmp_path / name)])
    settled(qtbot, w, 2)
    [newest, oldest] = stored()
    w.set_disk_budget(newest.bytes + oldest.bytes // 2)
    qtbot.waitUntil(lambda: [c.name for c in stored()] == [newest.name], timeout=TURN_TIMEOUT_MS)
    dialog = w.edit_settings()  # the setting, in MiB, is remembered
    dialog.disk_budget.setValue(64)
    dialog.accept()
    assert w.preferences.disk_budget == 64 << 20
    w.close()


def test_a_document_longer_than_half_the_context_is_read_in_parts_and_the_first_message_chooses_them(
        qtbot, window, tmp_path):
    doc = tmp_path / "crates.txt"
    doc.write_text("".join(f"Paragraph {i}: crate number {i} holds {i * 3} apples.\n\n" for i in range(120)))
    w = window()
    drop(w, doc)
    (chip,) = settled(qtbot, w)
    assert chip.state == READY and "parts" in chip.reason  # not refused: read as a fleet
    send(qtbot, w, "How many apples does crate number 7 hold?")
    parts = w.store.attachments(w.current_id)
    assert 1 <= len(parts) <= 3 and all("part" in r["name"] for r in parts)
    qtbot.waitUntil(lambda: [c.name for c in chips(w)] == [r["name"] for r in parts], timeout=TURN_TIMEOUT_MS)
    assert [m["role"] for m in w.store.active_branch(w.current_id)] == ["user", "assistant"]
