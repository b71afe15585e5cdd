"""Response formats and speculation without a model: the grammar editor's validation as you type, the
settings dialog carrying the format and the speculation preference, JSON replies rendered pretty with a
Copy of the exact text, and the status line's speculation figures."""

import json
import threading

from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QDialogButtonBox

from app.gui.json_view import JsonView
from app.gui.markdown_view import MarkdownView
from app.gui.message_widget import MessageWidget
from app.gui.preferences import Preferences
from app.gui.response_format import SCHEMA_PRESETS, GrammarValidator, ResponseFormatEditor
from app.gui.settings_dialog import SettingsDialog
from app.gui.status_line import describe
from app.gui.worker import EngineStatus

SCHEMA = {"type": "json_schema", "grammar": '{"type": "object", "properties": {"ok": {"type": "boolean"}}}'}


def editor_settled(editor):
    return editor.message.text() not in ("", "checking…")


def test_editor_shows_llguidance_error_for_a_malformed_schema_and_none_for_a_valid_one(qtbot):
    editor = ResponseFormatEditor()
    qtbot.addWidget(editor)
    editor.kind.setCurrentIndex(editor.kind.findData("json_schema"))
    assert editor.editor.isVisibleTo(editor)
    qtbot.keyClicks(editor.text, '{"type": "objectx"}')  # typed: validated once the typing pauses
    assert not editor.valid and editor.message.text() == "checking…"
    qtbot.waitUntil(lambda: editor_settled(editor))
    assert "Invalid type: objectx" in editor.message.text() and not editor.valid

    editor.text.setPlainText('{"type": "object", "properties": {"name": {"type": "string"}}}')
    qtbot.waitUntil(lambda: editor.valid)
    assert editor.message.text() == "✓ JSON schema is valid"

    editor.kind.setCurrentIndex(editor.kind.findData("regex"))
    editor.text.setPlainText("[a-z]+(")
    qtbot.waitUntil(lambda: editor_settled(editor))
    assert "unclosed group" in editor.message.text() and not editor.valid
    editor.kind.setCurrentIndex(editor.kind.findData("json_object"))  # no text to check
    assert editor.valid and not editor.editor.isVisibleTo(editor) and editor.message.text() == ""
    assert editor.format() == {"type": "json_object", "grammar": ""}


def test_validation_runs_off_the_gui_thread_and_stale_answers_are_ignored(qtbot, monkeypatch):
    import app.gui.response_format as module

    threads, release = [], threading.Event()
    check = module.grammar_error

    def slow_check(kind, text):  # the first (valid) text is still compiling when the second is typed
        threads.append(threading.current_thread())
        release.wait(5)
        return check(kind, text)

    monkeypatch.setattr(module, "grammar_error", slow_check)
    editor = ResponseFormatEditor(GrammarValidator())
    qtbot.addWidget(editor)
    validity = []
    editor.validity_changed.connect(validity.append)
    editor.set_format(SCHEMA)
    editor.text.setPlainText("{")
    editor._validate()  # the debounce's end
    release.set()
    qtbot.waitUntil(lambda: editor_settled(editor))
    assert "not valid JSON" in editor.message.text() and not editor.valid
    assert True not in validity, "the answer for the text replaced since was shown"
    assert threads and threading.main_thread() not in threads


def test_presets_are_valid_schemas(qtbot):
    editor = ResponseFormatEditor()
    qtbot.addWidget(editor)
    for i, name in enumerate(SCHEMA_PRESETS):
        editor.presets.setCurrentIndex(i)
        editor.presets.activated.emit(i)
        assert editor.kind.currentData() == "json_schema" and editor.text.toPlainText() == SCHEMA_PRESETS[name]
        qtbot.waitUntil(lambda: editor_settled(editor))
        assert editor.valid, f"preset {name}: {editor.message.text()}"


def test_settings_dialog_carries_the_format_and_refuses_an_invalid_one(qtbot, tmp_path):
    preferences = Preferences(tmp_path / "gui.ini")
    dialog = SettingsDialog({"system_prompt": None, "sampler": {"response_format": SCHEMA}}, preferences)
    qtbot.addWidget(dialog)
    ok = dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok)
    qtbot.waitUntil(lambda: ok.isEnabled())
    assert dialog.settings()["sampler"]["response_format"] == SCHEMA
    dialog.response_format.text.setPlainText('{"type": 3}')
    assert not ok.isEnabled()
    qtbot.waitUntil(lambda: editor_settled(dialog.response_format))
    assert not ok.isEnabled() and dialog.response_format.message.text()
    dialog.apply({"system_prompt": None, "sampler": {}})  # Restore defaults: free text
    assert ok.isEnabled() and "response_format" not in dialog.settings()["sampler"]
    assert dialog.speculation.isChecked()  # on by default


def test_json_reply_is_pretty_and_copy_gives_the_exact_text(qtbot):
    raw = '{"name":"Ada", "langs":["en","fr"],"n":1.50}'
    widget = MessageWidget({"id": "m", "role": "assistant", "content": raw,
                            "meta": {"response_format": "json_schema"}}, ["m"])
    qtbot.addWidget(widget)
    assert isinstance(widget.body, JsonView)
    block = widget.body.block
    assert block.code == json.dumps(json.loads(raw), indent=2) and block.language_label.text() == "JSON"
    assert "<span" in block.body.text()  # highlighted
    block.copy_button.click()
    assert QGuiApplication.clipboard().text() == raw

    widget.set_content('{"name": "Ad')  # mid-stream (or cut short): shown as written
    assert block.code == '{"name": "Ad' and block.language_label.text() == "JSON, as written"
    block.copy_button.click()
    assert QGuiApplication.clipboard().text() == '{"name": "Ad'
    free = MessageWidget({"id": "f", "role": "assistant", "content": raw, "meta": {}}, ["f"])
    qtbot.addWidget(free)
    assert isinstance(free.body, MarkdownView)


def test_status_line_shows_speculation_of_the_last_reply():
    turn = dict(context_used=150, context_size=4096, ttft_ms=42.4, decode_tps=55.55, reused_tokens=120,
                prefilled_tokens=9)
    assert "speculative" not in describe(EngineStatus(**turn))
    assert describe(EngineStatus(**turn, spec_tokens_per_step=2.345, spec_acceptance=0.713)).endswith(
        "55.5 tok/s  ·  warm: 120 reused, 9 prefilled  ·  speculative: 2.35 tokens/step, 71% of drafts accepted")
    assert describe(EngineStatus(**turn, spec_tokens_per_step=1.0)).endswith(
        "speculative: 1.00 tokens/step, nothing drafted")
