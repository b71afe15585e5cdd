"""Stored chats behind attached documents (engine.serving.session): the prompt is fitted to the context the prefix
leaves, and a reopened chat resumes behind the same documents."""

import pytest

from engine.cartridge.build import build
from engine.cartridge.ingest import Document
from engine.chat import template_for_model
from engine.history.store import HistoryStore
from engine.serving.session import ChatSession
from engine.tokenize import load_tokenizer

DOC = Document("notes.txt", "text", "The meeting moved to Thursday at noon. " * 4)


@pytest.fixture
def store(tmp_path):
    s = HistoryStore(tmp_path / "history.db")
    yield s
    s.close()


def cartridge(model):
    tok = load_tokenizer(model.file.metadata)
    return build(model, tok, template_for_model(model.file.metadata, tok), DOC)


def test_the_prompt_fits_the_context_left_after_the_documents(tiny_chat_file_model, store, tmp_path):
    model = tiny_chat_file_model
    cart = cartridge(model)
    session = ChatSession.open(store, model, sidecar_dir=tmp_path / "sidecars", attachments=[cart],
                               sampler={"temperature": 0.0, "max_tokens": 4, "ctx": cart.rows + 120})
    for user in ["first question about the meeting", "second question about it", "third one, please"]:
        "".join(session.send(user))
        assert session.last_turn.finish_reason != "error", session.last_turn.error
    assert session.last_window.left_out_turns > 0  # the oldest turn made room; the prefix stayed
    assert session.convo.prefix_rows == cart.rows
    session.close()
    reopened = ChatSession(store, model, session.id, sidecar_dir=tmp_path / "sidecars", attachments=[cart])
    assert reopened.resumed_positions == session.context_used
    reopened.close()


def test_a_reopened_chat_attaches_its_recorded_documents_and_continues_as_the_uninterrupted_one(
        tiny_chat_file_model, store, tmp_path, cartridges):
    from engine.cartridge.build import attach
    from engine.cartridge.chat_documents import cartridges as served, record, restore
    from engine.cartridge.ingest import read_document
    from tests.engine.cartridge.test_serving import assert_same_cache

    model = tiny_chat_file_model
    tok = load_tokenizer(model.file.metadata)
    template = template_for_model(model.file.metadata, tok)
    source = tmp_path / "notes.txt"
    source.write_text(DOC.text)
    attached = attach(model, tok, template, read_document(source))
    greedy = {"temperature": 0.0, "max_tokens": 5}
    uninterrupted = ChatSession.open(store, model, sidecar_dir=tmp_path / "other", attachments=[attached.cartridge],
                                     sampler=greedy)
    expected = ["".join(uninterrupted.send(t)) for t in ("when is it?", "and where?")]
    first = ChatSession.open(store, model, sidecar_dir=tmp_path / "sidecars", attachments=[attached.cartridge],
                             sampler=greedy)
    record(store, first.id, source, attached)
    assert "".join(first.send("when is it?")) == expected[0]
    first.close()

    def reopen():
        restored = restore(store, first.id, model, tok, template)
        return restored, ChatSession(store, model, first.id, sidecar_dir=tmp_path / "sidecars",
                                     attachments=served(restored))

    restored, reopened = reopen()  # loaded from the cartridge store: nothing read again
    assert [r.note for r in restored] == [None]
    assert reopened.resumed_positions == first.context_used and reopened.convo.prefix_rows == attached.cartridge.rows
    assert "".join(reopened.send("and where?")) == expected[1]
    assert_same_cache(reopened.convo.cache, uninterrupted.convo.cache)
    reopened.close()

    cart_file = attached.path
    cart_file.write_bytes(cart_file.read_bytes()[:100])  # truncated: refused, read again from the file, still warm
    restored, reopened = reopen()
    assert "damaged" in restored[0].note and reopened.resumed_positions == reopened.context_used > 0
    reopened.close()

    cart_file.unlink()  # evicted, and the file changed since: read as it is now
    source.write_text("The meeting moved to Friday.")
    restored, reopened = reopen()
    assert "changed since it was attached" in restored[0].note
    assert store.attachments(first.id)[0]["document"] == read_document(source).sha256
    reopened.close()

    for path in cartridges.glob("*.safetensors"):  # its cartridge gone and the file too: the chat opens without it
        path.unlink()
    source.unlink()
    restored, reopened = reopen()
    assert restored[0].cartridge is None and "notes.txt was left out" in restored[0].note
    assert reopened.convo.prefix_rows == 0 and reopened.resumed_positions == 0
    "".join(reopened.send("still there?"))
    assert reopened.last_turn.finish_reason != "error"
    reopened.close()
    uninterrupted.close()


def test_a_branch_that_cannot_fit_counts_what_the_cache_holds_past_the_documents(tiny_chat_file_model, store,
                                                                                   tmp_path):
    from engine.errors import ContextFull

    model = tiny_chat_file_model
    cart = cartridge(model)
    session = ChatSession.open(store, model, sidecar_dir=tmp_path / "sidecars", attachments=[cart],
                               sampler={"temperature": 0.0, "max_tokens": 4, "ctx": cart.rows + 120})
    "".join(session.send("a short question"))
    held = session.context_used - cart.rows
    with pytest.raises(ContextFull):
        "".join(session.send("far too long " * 40))  # stored, but no window holds it
    assert session.branch_fill() == (held, 0)  # the documents' rows are counted apart (convo.prefix_rows)
    session.close()
