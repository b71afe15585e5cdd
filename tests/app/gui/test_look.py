"""The look: themes (switched, remembered, rendered), icon buttons, hover-revealed message actions, the
welcome screen, long messages folded, the growing composer, the stopped mark, quotes and math."""

import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent, QPointF, Qt
from PySide6.QtGui import QEnterEvent, QImage, QPalette
from PySide6.QtWidgets import QApplication

from app.gui.composer import MAX_LINES, Composer
from app.gui.icons import IconButton
from app.gui.markdown_segments import Segment, split_markdown
from app.gui.markdown_view import MarkdownView, MathBlock, QuoteBlock
from app.gui.message_widget import COLLAPSED_HEIGHT_PX, MessageWidget
from app.gui.preferences import Preferences
from app.gui.tex import inline_math_as_markdown, tex_to_unicode
from app.gui.welcome import EXAMPLE_PROMPTS
from tests.app.gui.conftest import TURN_TIMEOUT_MS

REPO = Path(__file__).resolve().parents[3]
GREEDY = {"system_prompt": None, "sampler": {"temperature": 0.0, "max_tokens": 8}}


@pytest.fixture
def bare_window(qtbot, tmp_path, monkeypatch):
    """Factory: a main window on an empty data directory, with no model."""
    from app.gui.main_window import MainWindow

    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))

    def open_(conversation_id=None):
        window = MainWindow(conversation_id, first_run_picker=False)
        qtbot.addWidget(window)
        window.show()
        return window

    yield open_
    from app.gui.theme import apply_theme

    apply_theme("light")  # the tests after these see the same look whatever these chose


def window_color():
    return QApplication.palette().color(QPalette.ColorRole.Window)


def test_the_theme_switch_changes_the_palette_and_is_remembered(bare_window, tmp_path):
    from app.gui.main_window import PREFERENCES_FILE

    window = bare_window()
    window.set_theme("dark")
    assert window_color().lightness() < 60
    assert Preferences(tmp_path / PREFERENCES_FILE).theme == "dark"
    assert [a.text() for a in window.theme_actions.actions() if a.isChecked()] == ["Dark"]
    window.set_theme("light")
    assert window_color().lightness() > 200
    window.close()
    assert Preferences(tmp_path / PREFERENCES_FILE).theme == "light"
    assert bare_window().theme == "light"  # the next start opens in it


def test_a_nonsense_theme_in_the_preferences_falls_back_to_the_system(tmp_path):
    preferences = Preferences(tmp_path / "gui.ini")
    preferences._settings.setValue("window/theme", "purple")
    assert preferences.theme == "system"


def conversation_with_a_reply(tmp_path, reply_meta=None):
    from engine.history.store import HistoryStore

    with HistoryStore(tmp_path / "history.db") as store:
        cid = store.create_conversation("model.gguf")
        store.add_message(cid, "user", "Hello")
        store.add_message(cid, "assistant", "Hi! How can I help?", meta=reply_meta)
    return cid


def test_a_closed_window_ignores_a_theme_change(bare_window, tmp_path):
    from app.gui.theme import apply_theme

    window = bare_window(conversation_with_a_reply(tmp_path))
    window.close()  # its store is closed now: re-rendering the chat would read from it
    apply_theme("dark")  # before: "Cannot operate on a closed database" in changeEvent, then a crash
    assert window.closed and window.chat_view.widgets  # left as it was


def test_every_icon_button_has_an_icon_an_accessible_name_and_a_tooltip(bare_window, tmp_path):
    window = bare_window(conversation_with_a_reply(tmp_path))
    buttons = window.findChildren(IconButton)
    assert len(buttons) >= 8  # header, composer, and each message's actions
    missing = [b for b in buttons if b.icon().isNull() or not b.accessibleName() or not b.toolTip()]
    assert missing == []


def actions_revealed(widget: MessageWidget) -> bool:
    """The card's actions show (they fade rather than hide, to keep their place in the Tab order)."""
    return widget.action_bar.graphicsEffect().opacity() > 0


def test_message_actions_show_on_hover_and_on_keyboard_focus(qtbot):
    widget = MessageWidget({"id": "m1", "role": "user", "content": "Hello"}, ["m1"], is_last=True)
    qtbot.addWidget(widget)
    widget.show()
    assert not actions_revealed(widget)
    QApplication.sendEvent(widget, QEnterEvent(QPointF(5, 5), QPointF(5, 5), QPointF(5, 5)))
    assert actions_revealed(widget)
    QApplication.sendEvent(widget, QEvent(QEvent.Type.Leave))
    assert not actions_revealed(widget)
    widget.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is widget)
    widget.card.setFocus(Qt.FocusReason.TabFocusReason)  # Tab onto the card...
    qtbot.waitUntil(lambda: actions_revealed(widget))
    assert widget.actions_["edit"].focusPolicy() & Qt.FocusPolicy.TabFocus  # ...and on to its actions


def test_an_example_prompt_without_a_model_fills_the_message_box(bare_window):
    window = bare_window()
    assert window.chat_stack.currentWidget() is window.welcome
    window.welcome.prompt_buttons[1].click()
    assert window.composer.input.toPlainText() == EXAMPLE_PROMPTS[1][1]
    assert not window.streaming


def test_an_example_prompt_is_sent_and_the_chat_replaces_the_welcome(qtbot, open_window):
    window = open_window()
    window.new_chat()
    window.apply_settings(GREEDY)
    assert window.chat_stack.currentWidget() is window.welcome
    window.welcome.prompt_buttons[0].click()
    assert window.streaming and window.chat_stack.currentWidget() is window.chat_view
    qtbot.waitUntil(lambda: not window.streaming, timeout=TURN_TIMEOUT_MS)
    first = window.chat_view.widgets[0]
    assert (first.role, first.content) == ("user", EXAMPLE_PROMPTS[0][1])
    window.new_chat()
    assert window.chat_stack.currentWidget() is window.welcome


def test_a_long_message_opens_folded_and_unfolds(qtbot):
    text = "\n\n".join(f"Paragraph {i}: " + "words " * 30 for i in range(60))
    widget = MessageWidget({"id": "m1", "role": "assistant", "content": text}, ["m1"])
    qtbot.addWidget(widget)
    widget.resize(700, 400)
    widget.show()
    assert widget.collapsed and widget.body.height() <= COLLAPSED_HEIGHT_PX
    widget.expand_button.click()
    assert not widget.collapsed and widget.expand_button.text() == "Show less"
    qtbot.waitUntil(lambda: widget.body.height() > 3 * COLLAPSED_HEIGHT_PX)
    widget.expand_button.click()
    assert widget.collapsed and widget.expand_button.accessibleName() == "Show more"
    short = MessageWidget({"id": "m2", "role": "assistant", "content": "Short."}, ["m2"])
    qtbot.addWidget(short)
    assert short.expand_button is None
    streaming = MessageWidget({"id": None, "role": "assistant", "content": text}, [])
    qtbot.addWidget(streaming)
    assert streaming.expand_button is None  # a reply being written is never folded under the reader


def test_the_composer_grows_with_its_text_up_to_a_limit(qtbot):
    composer = Composer()
    qtbot.addWidget(composer)
    composer.resize(600, 200)
    composer.show()
    field = composer.input
    one_line = field.height()
    field.setPlainText("one\ntwo\nthree")
    qtbot.waitUntil(lambda: field.height() > one_line)
    three_lines = field.height()
    assert three_lines == field.height_for_lines(3)
    field.setPlainText("\n".join(["line"] * 50))
    qtbot.waitUntil(lambda: field.height() == field.height_for_lines(MAX_LINES))
    field.setPlainText("\n".join(["line"] * 200))
    qtbot.wait(50)
    assert field.height() == field.height_for_lines(MAX_LINES)  # then it scrolls
    field.clear()
    qtbot.waitUntil(lambda: field.height() == one_line)


def test_a_stopped_reply_carries_a_stopped_mark(qtbot):
    stopped = MessageWidget({"id": "m1", "role": "assistant", "content": "Once upon",
                             "meta": {"finish_reason": "cancelled"}}, ["m1"])
    finished = MessageWidget({"id": "m2", "role": "assistant", "content": "Done.",
                              "meta": {"finish_reason": "stop"}}, ["m2"])
    for widget in (stopped, finished):
        qtbot.addWidget(widget)
    assert stopped.stopped_mark is not None and stopped.stopped_mark.text() == "stopped"
    assert stopped.stopped_mark.accessibleName() == "Stopped reply"
    assert finished.stopped_mark is None


def test_a_reply_closed_at_its_limit_and_its_schema_warnings_are_marked(qtbot):
    closed = MessageWidget({"id": "m1", "role": "assistant", "content": '{"tags": ["a", "a"]}',
                            "meta": {"finish_reason": "length_closed", "response_format": "json_schema",
                                     "schema_warnings": ["$.tags: ['a', 'a'] has non-unique elements"]}}, ["m1"])
    finished = MessageWidget({"id": "m2", "role": "assistant", "content": "{}",
                              "meta": {"finish_reason": "stop", "response_format": "json_schema"}}, ["m2"])
    for widget in (closed, finished):
        qtbot.addWidget(widget)
    assert [m.text() for m in closed.closing_marks] == ["closed at the length limit", "1 schema warning"]
    assert "non-unique" in closed.closing_marks[1].toolTip()
    assert finished.closing_marks == []


def test_tex_becomes_readable_unicode():
    assert tex_to_unicode(r"\alpha^2 \le \frac{a}{b}") == "α² ≤ a⁄b"
    assert tex_to_unicode(r"\frac{n(n+1)}{2}") == "(n(n+1))⁄2"
    assert tex_to_unicode(r"\sum_{i=1}^{n} x_i") == "∑ᵢ₌₁ⁿ xᵢ"
    assert tex_to_unicode(r"\sqrt{x} \in \mathbb{R}") == "√x ∈ ℝ"
    assert tex_to_unicode(r"e^{i\pi} + \text{const}") == "e^(iπ) + const"  # no Unicode superscript for π
    assert tex_to_unicode(r"\unknown{x}") == r"\unknownx"  # left readable, not dropped


def test_inline_math_is_italic_unicode_and_prices_are_left_alone():
    assert inline_math_as_markdown(r"so $x^2 \cdot y$ grows") == "so *x² · y* grows"
    assert inline_math_as_markdown("costs $5 and $10 now") == "costs $5 and $10 now"
    assert inline_math_as_markdown(r"$a_*$") == r"*a\_\**"  # Markdown characters inside stay literal


def test_quotes_and_display_math_get_their_own_blocks(qtbot):
    text = "Intro\n> quoted *line*\n> second\nAfter\n$$\n\\frac{a}{b}\n$$\n$$x^2$$"
    assert split_markdown(text) == [
        Segment("prose", "Intro"), Segment("quote", "quoted *line*\nsecond"), Segment("prose", "After"),
        Segment("math", "\n\\frac{a}{b}\n"), Segment("math", "x^2")]
    view = MarkdownView(text)
    qtbot.addWidget(view)
    kinds = [type(part) for part in view._parts]
    assert kinds[1] is QuoteBlock and kinds[3:] == [MathBlock, MathBlock]
    assert view._parts[1].prose.text() == "quoted *line*\nsecond"
    assert [view._parts[3].text(), view._parts[4].text()] == ["a⁄b", "x²"]
    assert split_markdown("Text\n$$\n\\alpha") == [Segment("prose", "Text"), Segment("math", "\n\\alpha")]


def mean_lightness(image: QImage) -> float:
    samples = [image.pixelColor(x, y).lightness() for x in range(0, image.width(), 37)
               for y in range(0, image.height(), 37)]
    return sum(samples) / len(samples)


def test_screenshots_in_the_light_and_dark_themes_differ(tmp_path, monkeypatch):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path / "home"))  # no model: the welcome screen, fast
    images = {}
    for theme in ("light", "dark"):
        png = tmp_path / f"{theme}.png"
        run = subprocess.run([sys.executable, "-m", "app.cli", "--screenshot", str(png), "--theme", theme],
                             cwd=REPO, capture_output=True, text=True, timeout=TURN_TIMEOUT_MS / 1000)
        assert run.returncode == 0, run.stderr
        images[theme] = QImage(str(png))
    assert mean_lightness(images["light"]) > 200 and mean_lightness(images["dark"]) < 60
    assert Preferences(tmp_path / "home" / "gui.ini").theme == "system"  # a screenshot's theme is not remembered


def test_every_action_icon_is_valid_svg_drawn_in_the_theme_colour():
    from PySide6.QtSvg import QSvgRenderer

    from resources import resource_path

    icons = sorted(resource_path("icons/actions/copy.svg").parent.glob("*.svg"))
    assert {"copy", "edit", "delete", "regenerate", "send", "stop", "new-chat", "settings", "sidebar",
            "paperclip"} <= {svg.stem for svg in icons}
    for svg in icons:
        text = svg.read_text(encoding="utf-8")
        assert QSvgRenderer(text.encode()).isValid(), svg.name
        assert "currentColor" in text and "#" not in text, f"{svg.name} has a fixed colour"  # tinted per theme


def test_the_style_sheet_styles_the_sidebar_rows_the_window_shows(bare_window):
    """Its rows are styled by their view's class: the sidebar once became a QListView while the style sheet
    still named QListWidget, and its rows fell back to the platform's flat selection."""
    from app.gui.theme import LIGHT, style_sheet

    view = type(bare_window().sidebar.list).__name__
    sheet = style_sheet(LIGHT)
    assert f"#sidebarPane {view}::item {{" in sheet and f"#sidebarPane {view}::item:selected {{" in sheet
