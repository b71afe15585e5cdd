"""The chat as an item model with a view: the model's signals are as small as the change (streamed text is a
dataChanged on one row, another conversation one reset, an edit only the rows after it); the view builds
cards only near what is shown, so a 5,000-message conversation opens at once, a search hit far up in it
is scrolled to and highlighted, and a streaming reply is followed only by a reader at the bottom. Driven
without a model: the engine's events are emitted by hand."""

import time

import pytest
from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtWidgets import QAbstractSlider, QApplication, QLineEdit, QVBoxLayout, QWidget

from app.gui.chat_view import MAX_CARDS, RENDER_BATCH, ChatView
from app.gui.conversation_list import MESSAGE_ROLE as HIT_MESSAGE_ROLE
from app.gui.message_model import (CONTENT_ROLE, POSITION_ROLE, SIBLINGS_ROLE, STOPPED_ROLE, STREAMING_ROLE,
                                   TEXT_ROLES, MessageModel)
from app.gui.message_widget import MessageWidget
from engine.history.store import HistoryStore

LONG = 5000
OPEN_BOUND_S = 1.5  # measured about 0.2 s under load on 2 shared cores; building every card takes minutes


def branch(prefix: str, count: int) -> list[dict]:
    return [{"id": f"{prefix}{i}", "role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}",
             "meta": {}} for i in range(count)]


def recorded(model: MessageModel) -> list[tuple]:
    """The model's structural and data signals from now on, in order."""
    events = []
    model.modelReset.connect(lambda: events.append(("reset",)))
    model.rowsInserted.connect(lambda _parent, first, last: events.append(("inserted", first, last)))
    model.rowsRemoved.connect(lambda _parent, first, last: events.append(("removed", first, last)))
    model.dataChanged.connect(lambda top, bottom, roles: events.append(("changed", top.row(), bottom.row(),
                                                                        sorted(roles))))
    return events


@pytest.fixture
def model():
    return MessageModel(lambda message_id: [message_id])


def test_streamed_text_changes_the_reply_row_only_and_never_resets(model):
    model.show_branch(branch("a", 4))
    events = recorded(model)
    streaming = []
    model.streaming_changed.connect(streaming.append)
    model.begin_reply(4, "Next question")
    assert events == [("inserted", 4, 5)] and streaming == [True]
    assert model.streaming and model.reply_row == 5 and model.index(5).data(STREAMING_ROLE)
    events.clear()
    for piece in ("Once", " upon", "", " a time"):  # an empty piece changes nothing
        model.append_reply(piece)
    assert events == [("changed", 5, 5, sorted(TEXT_ROLES))] * 3
    assert model.index(5).data(CONTENT_ROLE) == model.last_reply_text() == "Once upon a time"
    model.end_reply()
    assert not model.streaming and streaming == [True, False]
    assert model.rowCount() == 6  # the reply stays shown until the store's version replaces it


def test_another_conversation_resets_once_and_the_same_one_changes_only_its_end(model):
    stored = branch("a", 6)
    model.show_branch(stored)
    events = recorded(model)
    edited = stored[:3] + [{"id": "edit", "role": "assistant", "content": "another", "meta": {}}]
    model.show_branch(edited)  # an edit, a delete or a switch at row 3: rows before it untouched
    assert events == [("removed", 3, 5), ("inserted", 3, 3)]
    events.clear()
    stopped = edited[:3] + [{**edited[3], "meta": {"finish_reason": "cancelled"}}]
    model.show_branch(stopped)  # the same message stored anew
    assert events == [("changed", 3, 3, [])] and model.index(3).data(STOPPED_ROLE)
    events.clear()
    model.show_branch(branch("b", 3))
    assert events == [("reset",)] and model.messages == branch("b", 3)
    events.clear()
    model.clear()
    model.clear()  # already empty: nothing to tell
    assert events == [("reset",)] and model.rowCount() == 0


def test_a_finished_turn_replaces_its_pending_rows_and_reads_alternatives_lazily():
    reads = []
    model = MessageModel(lambda message_id: reads.append(message_id) or ["old", message_id])
    model.show_branch(branch("a", 2))
    model.begin_reply(2, "Question")
    events = recorded(model)
    model.end_reply()
    model.show_branch(branch("a", 4))  # the store's version of the turn
    assert [e for e in events if e[0] != "changed"] == [("removed", 2, 3), ("inserted", 2, 3)]
    assert reads == []  # nothing asked the store yet
    assert model.index(3).data(SIBLINGS_ROLE) == ["old", "a3"] and model.index(3).data(POSITION_ROLE) == (1, 2)
    model.index(3).data(SIBLINGS_ROLE)
    assert reads == ["a3"]


def test_the_view_updates_the_streaming_card_in_place(qtbot, model):
    model.show_branch(branch("a", 2))
    view = ChatView(model)
    qtbot.addWidget(view)
    model.begin_reply(2, "Question")
    assert [w.content for w in view.widgets] == ["message 0", "message 1", "Question", ""]
    card = view.widgets[-1]
    assert view.thinking is not None and view.thinking.parent() is card.card  # in the card, under its heading
    assert not view.widgets[0].actions_["delete"].isEnabled()  # the tree waits for the reply
    model.append_reply("Hello")
    model.append_reply(" there")
    assert view.widgets[-1] is card and card.content == "Hello there" and view.thinking is None
    model.end_reply()
    model.show_branch(branch("a", 4))
    assert [w.message_id for w in view.widgets] == ["a0", "a1", "a2", "a3"]
    assert view.widgets[0].actions_["delete"].isEnabled()
    assert [("regenerate" in w.actions_) for w in view.widgets] == [False, False, False, True]


def tab_stops(start: QWidget) -> list[str]:
    """Where Tab goes from `start` round to it again: each card's row and the stop's accessible name."""
    stops, current = [], start.nextInFocusChain()
    while current is not start:
        card = current
        while card is not None and not isinstance(card, MessageWidget):
            card = card.parentWidget()
        if current.focusPolicy() & Qt.FocusPolicy.TabFocus and current.isEnabled():
            stops.append(f"{card.message_id if card else '-'} {current.accessibleName()}")
        current = current.nextInFocusChain()
    return stops


def test_tab_walks_the_cards_in_the_chat_s_order_as_cards_are_built_and_rebuilt(qtbot, model):
    page = QWidget()
    column = QVBoxLayout(page)
    before, after = QLineEdit(accessibleName="before"), QLineEdit(accessibleName="after")
    model.show_branch(branch("a", 3 * RENDER_BATCH))
    view = ChatView(model)
    for widget in (before, view, after):
        column.addWidget(widget)
    qtbot.addWidget(page)
    page.show()
    bar = view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0)
    bar.triggerAction(QAbstractSlider.SliderAction.SliderToMinimum)  # older cards, built after the others
    model.show_branch(branch("a", 3 * RENDER_BATCH - 1))  # the last reply deleted: the card before it rebuilt
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    shown = range(RENDER_BATCH, 3 * RENDER_BATCH - 1)
    expected = [stop for i in shown for stop in
                ([f"a{i} You message", f"a{i} Copy message", f"a{i} Edit message", f"a{i} Delete message"]
                 if i % 2 == 0 else [f"a{i} Assistant message", f"a{i} Copy message", f"a{i} Delete message"])]
    expected.insert(-2, f"a{shown[-1]} Answer message")  # the last message, a user's, offers an answer
    assert tab_stops(before) == ["- Conversation", *expected, "- after"]


def long_conversation(store: HistoryStore, count: int) -> str:
    """A conversation of `count` messages (its ninth the search hit), written in one transaction."""
    messages = [{"id": str(i), "parent_id": str(i - 1) if i else None, "role": "user" if i % 2 == 0 else "assistant",
                 "content": (f"Question {i}: what is {i} squared?" if i % 2 == 0 else
                             f"**{i}** squared is `{i * i}`.\n\n- one\n- two"), "meta": {}} for i in range(count)]
    messages[8]["content"] = "The Sieve of Eratosthenes finds primes."
    return store.import_json({"format": "fucina-conversation", "version": 1,
                              "conversation": {"title": "Long", "model": "model.gguf", "active_leaf": str(count - 1)},
                              "messages": messages})


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    """A window with no model on a store holding a 5,000-message conversation and a short one."""
    from app.gui.main_window import MainWindow

    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    with HistoryStore(HistoryStore.default_path()) as store:
        long_id = long_conversation(store, LONG)
        short_id = store.create_conversation("model.gguf", title="Short")
        store.add_message(short_id, "user", "Hello")
    window = MainWindow(short_id, first_run_picker=False)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    window.long_id, window.short_id = long_id, short_id
    return window


def test_a_5000_message_conversation_opens_with_a_batch_of_cards_and_resets_once(qtbot, window):
    events = recorded(window.chat_model)
    start = time.perf_counter()
    window.open_conversation(window.long_id)
    QApplication.processEvents()  # laid out
    opened_s = time.perf_counter() - start
    view = window.chat_view
    print(f"\nopening {LONG} messages took {opened_s * 1e3:.0f} ms ({len(view.widgets)} cards built)")
    assert events == [("reset",)]
    assert window.chat_model.rowCount() == LONG
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)  # the short chat's card is gone
    assert len(view.widgets) == len(view.findChildren(MessageWidget)) == RENDER_BATCH
    assert view.widgets[-1].content.startswith(f"**{LONG - 1}**") and "regenerate" in view.widgets[-1].actions_
    assert opened_s < OPEN_BOUND_S
    qtbot.waitUntil(lambda: view.verticalScrollBar().maximum() > 0)
    qtbot.waitUntil(lambda: view.verticalScrollBar().value() == view.verticalScrollBar().maximum())  # at the end


def built_card(view: ChatView, message_id: str) -> MessageWidget | None:
    """The card of a message, if the view has built it."""
    return next((w for w in view.widgets if w.message_id == message_id), None)


def top_card(view: ChatView, value: int | None = None) -> tuple[MessageWidget, int]:
    """The card at the top of the view (scrolled to `value`, default where it is), and how far below the
    view's top it starts."""
    value = view.verticalScrollBar().value() if value is None else value
    y = lambda card: card.mapTo(view.widget(), QPoint(0, 0)).y()
    card = next(w for w in view.widgets if y(w) + w.height() > value)
    return card, y(card) - value


def test_scrolling_through_it_keeps_the_cards_bounded_and_the_reader_s_place_still(qtbot, window):
    window.open_conversation(window.long_id)
    view, bar = window.chat_view, window.chat_view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.value() == bar.maximum() > 0)
    for action, batches in ((QAbstractSlider.SliderAction.SliderToMinimum, 5),
                            (QAbstractSlider.SliderAction.SliderToMaximum, 3)):
        for _ in range(batches):  # a batch at a time, up to the older messages, then down again
            shown = [w.content for w in view.widgets]
            end = bar.minimum() if action == QAbstractSlider.SliderAction.SliderToMinimum else bar.maximum()
            card, offset = top_card(view, end)  # what the reader sees at that end
            bar.triggerAction(action)
            assert [w.content for w in view.widgets] != shown  # a batch built (and, past a limit, one dropped)
            assert len(view.widgets) <= MAX_CARDS
            qtbot.waitUntil(lambda: bar.value() != end and top_card(view) == (card, offset))
        qtbot.wait(100)  # laid out: the view stays on the card the reader saw
        assert top_card(view) == (card, offset)
    rows = [window.chat_model.row_of(w.message_id) for w in view.widgets]
    assert rows == list(range(LONG - MAX_CARDS, LONG))  # back at the end


def test_a_search_hit_far_up_is_scrolled_to_and_highlighted_then_sending_returns_to_the_end(qtbot, window):
    view, bar = window.chat_view, window.chat_view.verticalScrollBar()
    window.new_chat()
    qtbot.keyClick(window, Qt.Key.Key_K, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClicks(window.sidebar.search, "eratosthenes")
    hits = window.sidebar.list
    message_hits = lambda: [hits.model().index(i) for i in range(hits.model().rowCount())
                            if hits.model().index(i).data(HIT_MESSAGE_ROLE)]
    qtbot.waitUntil(lambda: bool(message_hits()))
    [hit] = message_hits()
    qtbot.mouseClick(hits.viewport(), Qt.MouseButton.LeftButton, pos=hits.visualRect(hit).center())
    assert window.current_id == window.long_id
    target = hit.data(HIT_MESSAGE_ROLE)
    assert window.chat_model.row_of(target) == 8
    found = built_card(view, target)
    assert found is not None and found.card.property("found") is True  # outlined in the accent colour
    assert len(view.widgets) <= RENDER_BATCH  # a batch around the hit, not everything after it

    def in_view() -> bool:
        top = found.mapTo(view.widget(), QPoint(0, 0)).y() - bar.value()
        return 0 <= top < view.viewport().height()

    qtbot.waitUntil(in_view)
    qtbot.wait(300)  # the layout settles, the view stays on the hit
    assert in_view()

    window._begin_turn(LONG, "And 5000 squared?")  # what sending does before it asks the engine
    assert view.widgets[-2].content == "And 5000 squared?" and view.widgets[-1].content == ""
    assert len(view.widgets) <= RENDER_BATCH + 2
    qtbot.waitUntil(lambda: bar.value() == bar.maximum() > 0)


def test_streaming_follows_the_bottom_only_while_the_reader_is_there(qtbot, window):
    bar, worker = window.chat_view.verticalScrollBar(), window.client.worker
    window.open_conversation(window.long_id)
    window._begin_turn(LONG, "Count to forty.")
    turn = window.client.current_turn
    for i in range(10):
        worker.reply_text.emit(f"{i}\n\n", turn)
        QApplication.processEvents()
    qtbot.waitUntil(lambda: bar.value() == bar.maximum() > 0)  # following the reply as it grows
    bar.triggerAction(QAbstractSlider.SliderAction.SliderPageStepSub)  # the reader scrolls up
    reading_at, bottom = bar.value(), bar.maximum()
    for i in range(10, 40):
        worker.reply_text.emit(f"{i}\n\n", turn)
        QApplication.processEvents()
    qtbot.waitUntil(lambda: bar.maximum() > bottom)  # the reply grew below
    qtbot.wait(50)
    assert bar.value() == reading_at
    bar.triggerAction(QAbstractSlider.SliderAction.SliderToMaximum)  # back at the bottom: followed again
    worker.reply_text.emit("the end\n\n" * 5, turn)
    qtbot.waitUntil(lambda: bar.value() == bar.maximum() > bottom)
