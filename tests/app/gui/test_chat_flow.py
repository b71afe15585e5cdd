"""Chatting through the window on the real default model: streaming, stop, regenerate, edit and branch
switching, delete, search, and a conversation that survives closing the app (resuming warm from its
sidecar)."""

from PySide6.QtCore import Qt

from app.gui.conversation_list import MESSAGE_ROLE
from tests.app.gui.conftest import TURN_TIMEOUT_MS

GREEDY = {"system_prompt": None, "sampler": {"temperature": 0.0, "max_tokens": 12}}


def wait_idle(qtbot, window):
    qtbot.waitUntil(lambda: not window.streaming, timeout=TURN_TIMEOUT_MS)


def send(qtbot, window, text):
    window.composer.input.setPlainText(text)
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    assert window.streaming
    wait_idle(qtbot, window)


def shown(window):
    return [(w.role, w.content) for w in window.chat_view.widgets]


def test_reply_streams_into_the_view(qtbot, open_window):
    window = open_window()
    window.apply_settings({**GREEDY, "sampler": {"temperature": 0.0, "max_tokens": 24}})
    updates = []
    window.client.worker.reply_text.connect(lambda text, _turn: updates.append(text))  # on the worker thread
    send(qtbot, window, "What is the capital of France?")
    assert len(updates) > 1, "the reply arrived in one piece instead of streaming"
    assert shown(window)[0] == ("user", "What is the capital of France?")
    role, reply = shown(window)[1]
    assert role == "assistant" and "Paris" in reply
    assert reply.startswith(updates[0])
    assert "tok/s" in window.status_line.text()
    titles = window.sidebar.list.model()
    assert "What is the capital of France?" in [titles.index(i).data() for i in range(titles.rowCount())]


def test_stop_mid_reply_keeps_the_partial_reply(qtbot, open_window):
    window = open_window()
    window.apply_settings({"system_prompt": None, "sampler": {"temperature": 0.0, "max_tokens": 400}})
    window.composer.input.setPlainText("Write a long story about a dragon.")
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: len(window.chat_model.last_reply_text()) > 20, timeout=TURN_TIMEOUT_MS)
    assert window.composer.stop_button.isVisible()
    assert not window.chat_view.widgets[0].actions_["edit"].isEnabled()  # the tree waits for the reply
    assert window.chat_view.widgets[0].actions_["copy"].isEnabled()
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Escape)
    wait_idle(qtbot, window)
    reply = window.store.active_branch(window.current_id)[-1]
    assert reply["role"] == "assistant" and reply["meta"]["finish_reason"] == "cancelled"
    assert 0 < reply["meta"]["generated_tokens"] < 400
    assert shown(window)[-1] == ("assistant", reply["content"])
    assert window.chat_view.widgets[-1].stopped_mark is not None  # the reply says it was cut short
    assert window.composer.send_button.isVisible() and window.chat_view.widgets[0].actions_["edit"].isEnabled()


def test_regenerate_edit_switch_and_delete(qtbot, open_window):
    window = open_window()
    window.apply_settings({"system_prompt": None, "sampler": {"temperature": 1.0, "max_tokens": 8}})
    send(qtbot, window, "Name a colour.")
    first_reply = window.chat_view.widgets[-1]
    qtbot.mouseClick(first_reply.actions_["regenerate"], Qt.MouseButton.LeftButton)
    wait_idle(qtbot, window)
    reply = window.chat_view.widgets[-1]
    assert reply.message_id != first_reply.message_id
    assert reply.position_label.text() == "2/2"

    user = window.chat_view.widgets[0]
    qtbot.mouseClick(user.actions_["edit"], Qt.MouseButton.LeftButton)
    user.edit_box.setPlainText("Name an animal.")
    qtbot.mouseClick(user.save_edit_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, window)
    edited = window.chat_view.widgets[0]
    assert edited.content == "Name an animal." and edited.position_label.text() == "2/2"
    assert len(window.chat_view.widgets) == 2

    qtbot.mouseClick(edited.previous_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.chat_view.widgets[0].content == "Name a colour.")
    assert window.chat_view.widgets[0].position_label.text() == "1/2"
    assert window.chat_view.widgets[1].position_label.text() == "2/2"  # its regenerated reply

    last = window.chat_view.widgets[-1]
    qtbot.mouseClick(last.actions_["delete"], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(window.chat_view.widgets) == 1)  # the branch ends at the user message now
    assert [m["content"] for m in window.store.active_branch(window.current_id)] == ["Name a colour."]
    assert len(window.store.siblings(first_reply.message_id)) == 1  # the other reply is still there

    qtbot.mouseClick(window.chat_view.widgets[0].actions_["regenerate"], Qt.MouseButton.LeftButton)  # "Answer"
    wait_idle(qtbot, window)
    assert [w.role for w in window.chat_view.widgets] == ["user", "assistant"]
    assert window.chat_view.widgets[1].position_label.text() == "2/2"


def message_hits(view):
    """The indexes of a search's message hits (not its title matches) in the sidebar's list."""
    model = view.model()
    return [model.index(i) for i in range(model.rowCount()) if model.index(i).data(MESSAGE_ROLE)]


def test_search_finds_a_message_and_jumps_to_it(qtbot, open_window):
    window = open_window()
    window.apply_settings(GREEDY)
    send(qtbot, window, "Tell me about zebras.")
    window.new_chat()
    assert window.chat_view.widgets == []
    qtbot.keyClick(window, Qt.Key.Key_K, Qt.KeyboardModifier.ControlModifier)
    assert window.sidebar.search.hasFocus()
    qtbot.keyClicks(window.sidebar.search, "zebras")
    hits = window.sidebar.list
    qtbot.waitUntil(lambda: bool(message_hits(hits)))
    hit = next(index for index in message_hits(hits) if "zebras" in index.data())
    qtbot.mouseClick(hits.viewport(), Qt.MouseButton.LeftButton, pos=hits.visualRect(hit).center())
    qtbot.waitUntil(lambda: [w.content for w in window.chat_view.widgets][:1] == ["Tell me about zebras."])


def test_a_search_hit_opens_its_chat_scrolled_to_the_message_and_highlights_it(qtbot, open_window, fucina_home):
    from engine.history.store import HistoryStore

    with HistoryStore(HistoryStore.default_path()) as store:  # a long chat, the hit in its middle
        cid = store.create_conversation("model.gguf", title="Long")
        for i in range(30):
            text = "The Sieve of Eratosthenes finds primes." if i == 15 else f"Message {i}. " + "Filler text. " * 40
            store.add_message(cid, "user" if i % 2 == 0 else "assistant", text)
        target = store.active_branch(cid)[15]["id"]
    window = open_window()
    window.new_chat()
    window.sidebar.search.setText("eratosthenes")
    hits = window.sidebar.list
    qtbot.waitUntil(lambda: bool(message_hits(hits)))
    [hit] = message_hits(hits)
    assert "Sieve of Eratosthenes" in hit.data() and "[" not in hit.data()
    qtbot.mouseClick(hits.viewport(), Qt.MouseButton.LeftButton, pos=hits.visualRect(hit).center())
    view = window.chat_view
    found = next(w for w in view.widgets if w.message_id == target)

    def in_view():
        top = found.mapTo(view.widget(), found.rect().topLeft()).y() - view.verticalScrollBar().value()
        return 0 <= top < view.viewport().height()

    qtbot.waitUntil(lambda: window.current_id == cid and in_view())
    qtbot.wait(300)  # the layout settles, the view stays on the hit
    assert in_view()
    assert found.card.property("found") is True  # outlined in the accent colour


def test_the_conversation_survives_closing_the_app_and_resumes_warm(qtbot, open_window):
    window = open_window()
    window.apply_settings(GREEDY)
    send(qtbot, window, "What is the capital of France?")
    conversation_id, before = window.current_id, shown(window)
    context_used = window.status_line.status.context_used
    window.resize(720, 540)  # within the offscreen screen (800 x 600): restoring clamps to it
    window.close()

    window = open_window()  # same data directory: the last conversation opens again, in the same size
    assert window.current_id == conversation_id
    assert (window.width(), window.height()) == (720, 540)
    qtbot.waitUntil(lambda: window.status_line.status.context_size > 0, timeout=TURN_TIMEOUT_MS)
    assert shown(window) == before
    assert window.status_line.status.resumed_positions == context_used
    send(qtbot, window, "And of Italy?")
    status = window.status_line.status
    assert status.reused_tokens == context_used, "the history was prefilled again"
    assert 0 < status.prefilled_tokens < 20  # only the new turn
    assert len(window.store.active_branch(conversation_id)) == 4
