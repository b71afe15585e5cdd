"""Widgets and helpers without a model: Markdown segments and rendering, sidebar grouping, the status
line, coalescing of reply text, and the settings dialog's presets."""

from datetime import date, datetime, timedelta, timezone

from PySide6.QtGui import QGuiApplication

from app.gui.markdown_segments import Segment, split_markdown
from app.gui.markdown_view import CodeBlock, MarkdownView, ProseLabel
from app.gui.preferences import Preferences
from app.gui.settings_dialog import SettingsDialog
from app.gui.conversation_list import conversation_group
from app.gui.status_line import describe, describe_prefill
from app.gui.worker import EngineStatus, PrefillProgress, TextBatcher


def test_split_markdown_separates_fenced_code():
    text = "# Title\nSome *prose*.\n```python\nx = 1\n```\nAfter.\n~~~\nopen fence"
    assert split_markdown(text) == [
        Segment("prose", "# Title\nSome *prose*."), Segment("code", "x = 1", "python"),
        Segment("prose", "After."), Segment("code", "open fence")]
    assert split_markdown("````md\n```\ninner\n```\n````") == [Segment("code", "```\ninner\n```", "md")]
    assert split_markdown("") == []


def test_markdown_view_updates_in_place_while_streaming(qtbot):
    view = MarkdownView("Here is code:\n```py")
    qtbot.addWidget(view)
    prose, code = view._parts
    assert isinstance(prose, ProseLabel) and isinstance(code, CodeBlock)
    view.set_markdown("Here is code:\n```py\ndef f():\n    return 1\n```\n| a | b |\n|---|---|\n| 1 | 2 |")
    assert view._parts[:2] == [prose, code], "streaming rebuilt widgets that only grew"
    assert "<span" in code.body.text() and code.language_label.text() == "py"
    code.copy_button.click()
    assert QGuiApplication.clipboard().text() == "def f():\n    return 1"
    table = view._parts[2]
    assert isinstance(table, ProseLabel) and table.text().startswith("| a | b |")
    assert code.copy_button.accessibleName() == "Copy code"


def test_conversations_group_by_date_or_pinned():
    today = date(2026, 5, 20)
    at = lambda days: datetime(2026, 5, 20, 12, tzinfo=timezone.utc).astimezone() - timedelta(days=days)
    convs = [{"id": str(i), "pinned": pinned, "updated_at": at(days).isoformat()}
             for i, (pinned, days) in enumerate([(True, 40), (False, 0), (False, 1), (False, 3), (False, 90)])]
    assert [conversation_group(c, today) for c in convs] == [
        "Pinned", "Today", "Yesterday", "Previous 7 days", "Older"]


def test_status_line_says_warm_or_cold():
    assert describe(EngineStatus()) == ""
    assert describe(EngineStatus(context_used=120, context_size=4096, resumed_positions=120)) == \
        "context 120 / 4,096  ·  resumed warm (120 positions)"
    turn = EngineStatus(context_used=150, context_size=4096, ttft_ms=42.4, decode_tps=55.55,
                        reused_tokens=120, prefilled_tokens=9)
    assert describe(turn) == ("context 150 / 4,096  ·  first token 42 ms  ·  55.5 tok/s  ·  "
                              "warm: 120 reused, 9 prefilled")
    behind = EngineStatus(context_used=900, context_size=4096, attachment_tokens=850)
    assert describe(behind) == "context 900 / 4,096 (850 in documents)  ·  cold start"


def test_status_line_says_what_the_context_leaves_out_and_how_far_a_long_prompt_is_read():
    full = EngineStatus(context_used=3000, context_size=4096, ttft_ms=42.4, decode_tps=55.55, reused_tokens=0,
                        prefilled_tokens=3000, left_out_turns=3)
    assert describe(full).startswith("context 3,000 / 4,096  ·  context full: 3 oldest turns left out  ·  first")
    stopped = EngineStatus(context_used=30, context_size=4096, ttft_ms=0.0, decode_tps=0.0,
                           prefilled_tokens=512, finish_reason="cancelled")
    assert describe(stopped) == "context 30 / 4,096  ·  stopped while reading the message"
    assert describe_prefill(PrefillProgress(1024, 5120)) == "reading prompt 1,024 / 5,120 tokens"
    assert describe_prefill(PrefillProgress(5120, 5120, 1)) == \
        "context full: 1 oldest turn left out  ·  writing the reply…"


def test_text_batcher_coalesces_pieces():
    sent = []
    batcher = TextBatcher(sent.append, interval=3600)
    for piece in ["a", "b", "c"]:
        batcher.add(piece)
    batcher.flush()
    assert sent == ["a", "bc"]  # the first piece goes out at once, the rest waits for the interval or flush


def test_settings_dialog_round_trips_and_saves_presets(qtbot, tmp_path, monkeypatch):
    preferences = Preferences(tmp_path / "gui.ini")
    settings = {"system_prompt": "Be brief.", "sampler": {"temperature": 0.2, "seed": 7, "max_tokens": 64,
                                                          "ctx": 2048, "context_policy": "stop"}}
    dialog = SettingsDialog(settings, preferences)
    qtbot.addWidget(dialog)
    got = dialog.settings()
    assert got["system_prompt"] == "Be brief."
    assert {k: got["sampler"][k] for k in settings["sampler"]} == settings["sampler"]
    monkeypatch.setattr("app.gui.settings_dialog.QInputDialog.getText", lambda *a, **k: ("Terse", True))
    dialog._save_preset()
    dialog.apply({"system_prompt": None, "sampler": {}})
    assert "seed" not in dialog.settings()["sampler"]  # random
    assert dialog.settings()["sampler"]["context_policy"] == "drop_oldest"  # the default
    dialog.presets.setCurrentText("Terse")
    dialog.presets.activated.emit(0)
    assert dialog.settings() == got
    assert Preferences(tmp_path / "gui.ini").presets["Terse"] == got
