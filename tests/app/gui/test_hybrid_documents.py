"""Documents in the window on a hybrid model (a tiny qwen35): its memory takes one document's cartridge, so a
second one dropped on the new chat fails its chip with the reason, before it is read, and the chat is served
behind the first."""

import pytest

from app.gui.document_jobs import FAILED, READY
from tests.app.gui.test_documents import GREEDY, TEXT, chips, drop, send, settled


@pytest.fixture(scope="module")
def hybrid_model(tmp_path_factory):
    from gguf import GGUFValueType

    from tests.hybrid_models import write_qwen35_model

    path = tmp_path_factory.mktemp("gui-hybrid-docs") / "qwen35.gguf"
    write_qwen35_model(path, "f32", metadata={"qwen35.context_length": (4096, GGUFValueType.UINT32)})
    return path


@pytest.fixture
def gui_model(hybrid_model):
    return hybrid_model


def test_a_second_document_fails_its_chip_and_the_chat_is_served_behind_the_first(qtbot, open_window, tmp_path):
    first, second = tmp_path / "facts.md", tmp_path / "more.md"
    first.write_text(TEXT)
    second.write_text("The shelves are numbered from the door.\n")
    w = open_window()
    w.apply_settings(GREEDY)
    drop(w, first)
    settled(qtbot, w)
    drop(w, second)
    ready, failed = settled(qtbot, w, 2)
    assert (ready.name, ready.state) == ("facts.md", READY)
    assert failed.state == FAILED and "attach one document at a time" in failed.reason and failed.tokens == 0
    send(qtbot, w, "What does item 3 weigh?")
    assert w.chat_model.messages[-1]["role"] == "assistant"
    assert [c.state for c in chips(w)] == [READY]  # the failed one was never part of the chat
    w.close()
