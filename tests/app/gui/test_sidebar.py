"""The sidebar's model and view over the history store, without a model or an engine: a store of
10,000 conversations opens one page at a time, a change to one conversation changes its one row (no
reset), and selection, rename, pin, delete, search and the keyboard work on the view."""

from datetime import datetime, timedelta, timezone

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication

from app.gui.conversation_list import GROUP_ROLE, ID_ROLE, MESSAGE_ROLE, PAGE_SIZE
from app.gui.sidebar import Sidebar
from engine.errors import StoreError
from engine.history.store import HistoryStore

MANY = 10_000


@pytest.fixture
def store(tmp_path):
    with HistoryStore(tmp_path / "history.db") as store:
        yield store


def fill(store, count):
    """`count` conversations in one transaction, conversation i updated i minutes ago (so row i shows it)."""
    now = datetime.now(timezone.utc)
    rows = [(f"c{i:05}", f"Chat {i}", "model.gguf", "{}", (now - timedelta(minutes=i)).isoformat(),
             (now - timedelta(minutes=i)).isoformat()) for i in range(count)]
    with store.db.conn:
        store.db.conn.executemany("INSERT INTO conversations (id, title, model, sampler, created_at, updated_at)"
                                  " VALUES (?, ?, ?, ?, ?, ?)", rows)


@pytest.fixture
def sidebar(qtbot, store):
    def open_(count):
        fill(store, count)
        sidebar = Sidebar(store)
        qtbot.addWidget(sidebar)
        sidebar.resize(260, 700)
        sidebar.show()
        qtbot.waitExposed(sidebar)
        return sidebar
    return open_


class Recorder:
    """The model signals a change emitted."""

    def __init__(self, model):
        self.events = []
        model.modelReset.connect(lambda: self.events.append("reset"))
        model.rowsInserted.connect(lambda _p, first, last: self.events.append(("inserted", first, last)))
        model.rowsRemoved.connect(lambda _p, first, last: self.events.append(("removed", first, last)))
        model.rowsMoved.connect(lambda _p, first, _l, _d, to: self.events.append(("moved", first, to)))
        model.dataChanged.connect(lambda first, last, *_: self.events.append(("changed", first.row(), last.row())))


def ids(model):
    return [model.index(i).data(ID_ROLE) for i in range(model.rowCount())]


def test_ten_thousand_conversations_open_one_page_at_a_time(qtbot, sidebar, store, monkeypatch):
    pages = []
    list_conversations = store.list_conversations
    monkeypatch.setattr(store, "list_conversations",
                        lambda *a, **k: pages.append(k.get("limit")) or list_conversations(*a, **k))
    view = sidebar(MANY)
    model = view.list.model()
    qtbot.wait(50)  # the view settles; it asks for no further page while its rows fill it
    assert model.rowCount() == PAGE_SIZE and model.canFetchMore()
    assert pages == [PAGE_SIZE]
    assert ids(model)[:2] == ["c00000", "c00001"]
    view.list.scrollToBottom()  # reading down the list brings the next page
    qtbot.waitUntil(lambda: model.rowCount() == 2 * PAGE_SIZE)
    assert pages == [PAGE_SIZE, PAGE_SIZE] and ids(model)[PAGE_SIZE] == f"c{PAGE_SIZE:05}"


def test_a_new_message_moves_its_one_row_to_the_top_without_a_reset(sidebar, store):
    view = sidebar(MANY)
    model = view.list.model()
    events = Recorder(model).events
    store.add_message("c00005", "user", "Hello again")
    view.conversation_changed("c00005")
    assert events == [("moved", 5, 0), ("changed", 0, 0)]
    assert ids(model)[:7] == ["c00005", "c00000", "c00001", "c00002", "c00003", "c00004", "c00006"]
    assert model.rowCount() == PAGE_SIZE
    events.clear()
    store.add_message("c00005", "assistant", "Hi")  # already on top: the row changes in place
    view.conversation_changed("c00005")
    assert events == [("changed", 0, 0)]


def test_a_conversation_below_the_loaded_page_comes_up_once(qtbot, sidebar, store):
    view = sidebar(MANY)
    model = view.list.model()
    events = Recorder(model).events
    store.add_message("c09000", "user", "An old chat, written to again")
    view.conversation_changed("c09000")
    assert events == [("inserted", 0, 0)] and ids(model)[0] == "c09000"
    store.rename("c00002", "Renamed far away")  # a rename moves a conversation up too
    view.conversation_changed("c00002")
    assert ids(model)[:2] == ["c00002", "c09000"]
    model.fetchMore()
    assert len(set(ids(model))) == model.rowCount() == 2 * PAGE_SIZE + 1  # no row twice


def test_create_rename_pin_and_delete_change_one_row(qtbot, sidebar, store):
    view = sidebar(3)
    model = view.list.model()
    events = Recorder(model).events
    created = store.create_conversation("model.gguf")
    view.select(created)  # what the window does with a conversation its first message made
    assert events == [("inserted", 0, 0)] and model.index(0).data() == "New conversation"
    assert view.list.currentIndex().row() == 0 and view.list.selectionModel().isSelected(model.index(0))

    events.clear()
    assert model.setData(model.index(2), "  Renamed  ")  # an in-place rename, ended with Enter
    assert store.get_conversation("c00001")["title"] == "Renamed"
    assert events == [("moved", 2, 0), ("changed", 0, 0)] and model.index(0).data() == "Renamed"
    assert not model.setData(model.index(0), "   ")  # an empty title is not taken
    assert store.get_conversation("c00001")["title"] == "Renamed"

    events.clear()
    view.set_pinned("c00002", True)
    assert events == [("moved", 3, 0), ("changed", 0, 0)]
    assert [model.index(i).data(GROUP_ROLE) for i in range(model.rowCount())] == ["Pinned"] + ["Today"] * 3

    events.clear()
    store.delete_conversation("c00000")
    view.conversation_removed("c00000")
    assert events == [("removed", 3, 3)] and "c00000" not in ids(model)


def test_a_rename_the_disk_refuses_is_reported_and_the_row_keeps_its_title(qtbot, sidebar, store, monkeypatch):
    view = sidebar(2)
    model = view.list.model()

    def refuse(*_):
        raise StoreError("cannot write history.db: disk full")

    monkeypatch.setattr(store, "rename", refuse)
    with qtbot.waitSignal(view.storage_failed) as failure:
        assert not model.setData(model.index(0), "New title")
    assert failure.args == ["cannot write history.db: disk full"]
    assert model.index(0).data() == "Chat 0"


def test_search_filters_titles_and_messages_and_clearing_it_shows_the_list_again(qtbot, sidebar, store):
    view = sidebar(50)
    store.add_message("c00040", "user", "Tell me about zebras and their stripes.")
    view.conversation_changed("c00040")
    store.rename("c00007", "Zebras at the zoo")
    view.conversation_changed("c00007")
    view.select("c00007")
    view.search.setText("zebras")
    qtbot.waitUntil(lambda: view.list.model() is view.results)
    shown = [(view.results.index(i).data(GROUP_ROLE), view.results.index(i).data(ID_ROLE),
              bool(view.results.index(i).data(MESSAGE_ROLE))) for i in range(view.results.rowCount())]
    assert shown == [("Titles", "c00007", False), ("Messages", "c00040", True)]
    assert view.results.index(1).data().startswith("Chat 40\n") and "zebras" in view.results.index(1).data()
    assert view.list.currentIndex().row() == 0  # the open conversation stays selected in the results
    assert view.no_matches.isHidden()

    view.search.setText("quagga")
    qtbot.waitUntil(lambda: view.results.rowCount() == 0)
    assert not view.no_matches.isHidden()
    view.search.clear()
    qtbot.waitUntil(lambda: view.list.model() is view.conversations)
    assert view.no_matches.isHidden() and view.list.currentIndex().data(ID_ROLE) == "c00007"


def test_the_context_menu_acts_on_the_row_under_the_pointer(qtbot, sidebar, store):
    view = sidebar(3)
    offered = []

    def choose_pin():  # runs inside the menu's own event loop, once it shows
        menu = QApplication.activePopupWidget()
        offered.append([action.text() for action in menu.actions() if action.text()])
        menu.close()
        next(action for action in menu.actions() if action.text() == "Pin").trigger()

    QTimer.singleShot(0, choose_pin)
    model = view.list.model()
    view.list.customContextMenuRequested.emit(view.list.visualRect(model.index(1)).center())
    assert offered == [["Rename", "Pin", "Export…", "Delete…"]]
    assert store.get_conversation("c00001")["pinned"] and ids(model)[0] == "c00001"


def test_the_keyboard_opens_the_next_conversation(qtbot, sidebar):
    view = sidebar(5)
    view.select("c00001")
    view.list.setFocus()
    qtbot.keyClick(view.list, Qt.Key.Key_Down)
    with qtbot.waitSignal(view.conversation_chosen) as chosen:
        qtbot.keyClick(view.list, Qt.Key.Key_Return)
    assert chosen.args == ["c00002"]


def test_a_heading_is_drawn_above_the_first_row_of_each_group(qtbot, sidebar, store):
    view = sidebar(3)
    view.set_pinned("c00002", True)
    delegate, model = view.list.itemDelegate(), view.list.model()
    assert [delegate.heading(model.index(i)) for i in range(3)] == ["Pinned", "Today", None]
    heights = [view.list.visualRect(model.index(i)).height() for i in range(3)]
    assert heights[0] == heights[1] > heights[2]  # a heading row is taller by its heading
