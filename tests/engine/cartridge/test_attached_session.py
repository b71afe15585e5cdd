"""Stored chats behind attached documents (engine.session): the prompt is fitted to the context the prefix
leaves, and a reopened chat resumes behind the same documents."""

import pytest

from engine.cartridge.build import build
from engine.cartridge.ingest import Document
from engine.chat import template_for_model
from engine.history.store import HistoryStore
from engine.session import ChatSession
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
