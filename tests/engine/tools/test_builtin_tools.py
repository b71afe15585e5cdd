"""The built-in offline tools: conversation search, attached documents, the one picked file."""

import pytest

from engine.history.store import HistoryStore
from engine.tools import ToolCall
from engine.tools.builtin import (BuiltinToolbox, ConversationSearch, DocumentReader, PickedFile, READ_DOCUMENT,
                                  READ_FILE, SEARCH_CONVERSATIONS)


def run(toolbox, tool, **arguments):
    return toolbox.run(ToolCall("c1", tool, arguments))


@pytest.fixture
def history(tmp_path):
    """The history's path, and the open chat's id."""
    path = tmp_path / "history.db"
    with HistoryStore(path) as store:
        cid = store.create_conversation("model.gguf")
        store.add_message(cid, "user", "How do I repot a fiddle leaf fig?")
        store.add_message(cid, "assistant", "Water the fiddle leaf fig a day before repotting it.")
        other = store.create_conversation("model.gguf")
        store.add_message(other, "user", "Explain quicksort")
        open_chat = store.create_conversation("model.gguf")
        store.add_message(open_chat, "user", "Search my chats for the fiddle leaf fig")
    return path, open_chat


def search(history):
    path, open_chat = history
    return BuiltinToolbox([ConversationSearch(path, lambda: open_chat)])


def test_search_finds_a_stored_conversation_but_not_the_open_one(history):
    result = run(search(history), SEARCH_CONVERSATIONS, query="fiddle leaf")
    assert not result.is_error
    assert result.content.startswith('- "How do I repot a fiddle leaf fig?" (')
    assert "assistant): Water the **fiddle** **leaf** fig a day before repotting it." in result.content
    assert "quicksort" not in result.content and "Search my chats" not in result.content


def test_search_says_when_nothing_matches_and_bounds_its_limit(history):
    assert run(search(history), SEARCH_CONVERSATIONS, query="zebra").content == \
        "no message of the user's other conversations contains: zebra"
    assert run(search(history), SEARCH_CONVERSATIONS, query="fiddle", limit="1").content.count("\n") == 0


def test_search_without_a_query_is_an_error_result(history):
    result = run(search(history), SEARCH_CONVERSATIONS)
    assert result.is_error and result.content == "the argument 'query' is missing"


def test_read_document_reads_an_attached_document_by_ranges(tmp_path):
    doc = tmp_path / "notes.md"
    doc.write_text("abcdefghij" * 3)
    box = BuiltinToolbox([DocumentReader(lambda: [("notes.md", doc)])])
    spec, = box.specs()
    assert spec.parameters["properties"]["name"]["enum"] == ["notes.md"]
    first = run(box, READ_DOCUMENT, name="notes.md", length=12)
    assert first.content == "[notes.md: characters 0-12 of 30; read on with start=12]\nabcdefghijab"
    assert run(box, READ_DOCUMENT, name="notes.md", start=25).content == \
        "[notes.md: characters 25-30 of 30 (the end)]\nfghij"
    assert run(box, READ_DOCUMENT, name="notes.md", start=30).content == \
        "notes.md has 30 characters; start must be below that"


def test_read_document_is_offered_only_with_a_document_attached(tmp_path):
    box = BuiltinToolbox([DocumentReader(lambda: [])])
    assert box.specs() == []
    result = run(box, READ_DOCUMENT, name="x")
    assert result.is_error and result.content == "no built-in tool read_document is available"


def test_read_document_names_the_attached_ones_when_asked_for_another(tmp_path):
    doc = tmp_path / "a.txt"
    doc.write_text("text")
    result = run(BuiltinToolbox([DocumentReader(lambda: [("a.txt", doc)])]), READ_DOCUMENT, name="b.txt")
    assert result.is_error and result.content == "no document 'b.txt' is attached to this chat (attached: a.txt)"


def test_read_document_whose_file_is_gone_is_an_error_result(tmp_path):
    result = run(BuiltinToolbox([DocumentReader(lambda: [("a.txt", tmp_path / "a.txt")])]), READ_DOCUMENT,
                 name="a.txt")
    assert result.is_error
    assert result.content == "the document a.txt cannot be read any more: No such file or directory"


def test_read_file_reads_the_picked_file_only(tmp_path):
    picked, other = tmp_path / "picked.txt", tmp_path / "secret.txt"
    picked.write_text("the picked file's text")
    other.write_text("not for the model")
    reader = PickedFile()
    box = BuiltinToolbox([reader])
    assert box.specs() == []  # nothing picked: nothing offered
    reader.pick(picked)
    assert run(box, READ_FILE).content == "[picked.txt: characters 0-22 of 22 (the end)]\nthe picked file's text"
    assert run(box, READ_FILE, path=str(picked)).content.endswith("the picked file's text")
    refused = run(box, READ_FILE, path=str(other))
    assert refused.is_error
    assert refused.content == f"only picked.txt, the file the user picked, can be read; not {other}"
    assert run(box, READ_FILE, path="../secret.txt").is_error


def test_read_file_refuses_a_file_over_its_size_bound_and_a_binary_one(tmp_path):
    big, binary = tmp_path / "big.log", tmp_path / "image.bin"
    big.write_text("x" * 2_000_001)
    binary.write_bytes(b"\x00\x01" * 100)
    reader = PickedFile(max_bytes=1_000_000)
    box = BuiltinToolbox([reader])
    reader.pick(big)
    assert run(box, READ_FILE).content == "big.log is 2.0 MB; files of up to 1.0 MB are read"
    reader.pick(binary)
    result = run(box, READ_FILE)
    assert result.is_error and "is a binary file, not text" in result.content
