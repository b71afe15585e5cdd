"""Speculative decoding and response formats through the window on the real default model: the toggle
persisted and reaching the conversation's options, the status line's speculation figures, and a JSON
schema format stored with the conversation, restored on reopening, its reply shown as JSON."""

import json

from PySide6.QtGui import QGuiApplication

from app.gui.json_view import JsonView
from app.gui.main_window import PREFERENCES_FILE
from app.gui.preferences import Preferences
from app.gui.response_format import SCHEMA_PRESETS
from tests.app.gui.conftest import TURN_TIMEOUT_MS
from tests.app.gui.test_chat_flow import GREEDY, send

YES_NO = {"type": "json_schema", "grammar": SCHEMA_PRESETS["Yes/no answer"]}


def options(window):
    return window.client.worker.session.convo.options


def test_speculation_toggle_is_remembered_and_reaches_the_next_reply(qtbot, open_window, fucina_home):
    window = open_window()
    window.apply_settings(GREEDY)
    send(qtbot, window, "Repeat after me: one two three, one two three.")
    assert options(window).speculation  # on by default
    assert "tokens/step" in window.status_line.text()

    dialog = window.edit_settings()
    assert dialog.speculation.isChecked()
    dialog.speculation.setChecked(False)
    dialog.accept()
    assert not Preferences(fucina_home / PREFERENCES_FILE).speculation
    qtbot.waitUntil(lambda: not options(window).speculation)
    send(qtbot, window, "Again.")
    assert "tok/s" in window.status_line.text() and "tokens/step" not in window.status_line.text()
    window.close()

    window = open_window()
    qtbot.waitUntil(lambda: window.client.worker.session is not None, timeout=TURN_TIMEOUT_MS)
    assert not options(window).speculation
    dialog = window.edit_settings()
    assert not dialog.speculation.isChecked()
    dialog.reject()


def test_json_schema_format_is_stored_restored_and_its_reply_shown_as_json(qtbot, open_window):
    window = open_window()
    dialog = window.edit_settings()
    dialog.response_format.presets.setCurrentText("Yes/no answer")
    dialog.response_format.presets.activated.emit(0)
    dialog.fields["temperature"].setValue(0.0)
    dialog.fields["max_tokens"].setValue(32)
    qtbot.waitUntil(lambda: dialog.response_format.valid)
    dialog.accept()
    send(qtbot, window, "Is the sky blue?")
    conversation_id = window.current_id
    assert window.store.get_conversation(conversation_id)["sampler"]["response_format"] == YES_NO

    reply = window.store.active_branch(conversation_id)[-1]
    assert json.loads(reply["content"])["answer"] in ("yes", "no")
    body = window.chat_view.widgets[-1].body
    assert isinstance(body, JsonView) and body.block.code == json.dumps(json.loads(reply["content"]), indent=2)
    body.block.copy_button.click()
    assert QGuiApplication.clipboard().text() == reply["content"]
    window.close()

    window = open_window()  # the last conversation reopens with its format
    assert window.current_id == conversation_id
    assert isinstance(window.chat_view.widgets[-1].body, JsonView)
    dialog = window.edit_settings()
    assert dialog.response_format.format() == YES_NO
    qtbot.waitUntil(lambda: dialog.response_format.valid)
    dialog.reject()
    qtbot.waitUntil(lambda: window.client.worker.session is not None, timeout=TURN_TIMEOUT_MS)
    assert options(window).grammar.kind == "json_schema"
