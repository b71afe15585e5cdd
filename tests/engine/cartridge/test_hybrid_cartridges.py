"""Documents on a hybrid model (qwen35: engine.kv.recurrent's memory): a cartridge is one snapshot of the whole
prefix, its attention layers' rows and the recurrent state after it, served bitwise as the real prefill, stored
and loaded whole; several do not compose (refused by name), and a long document's fleet serves one part."""

import numpy as np
import pytest

from engine.cartridge import store
from engine.cartridge.build import build, prefix_ids
from engine.cartridge.cartridge import write_composed
from engine.cartridge.for_chat import check_document_count, documents_compose, read_for_chat
from engine.cartridge.fleet import FleetDocument
from engine.cartridge.ingest import Document
from engine.chat import template_for_model
from engine.errors import CartridgeRefused, InvalidPrefix
from engine.history.store import HistoryStore
from engine.kv.cache import KvCache
from engine.models import load_model
from engine.models.model import UBATCH
from engine.serving.session import ChatSession
from engine.tokenize import load_tokenizer
from tests.hybrid_models import write_qwen35_model
from tests.row_wise import assert_same_cache

DOC = Document("notes.txt", "text", "The meeting moved to Thursday at noon, in the small room. " * 3)
OTHER = Document("more.txt", "text", "Bring the budget figures and the draft of the plan. " * 3)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """A tiny qwen35 model carrying the byte-level ChatML tokenizer in its file, its tokenizer and template."""
    from gguf import GGUFValueType

    path = tmp_path_factory.mktemp("hybrid-cartridge") / "qwen35.gguf"
    write_qwen35_model(path, "f32", metadata={"qwen35.context_length": (4096, GGUFValueType.UINT32)})
    model = load_model(path)
    tok = load_tokenizer(model.file.metadata)
    return model, tok, template_for_model(model.file.metadata, tok)


QUESTION = "<|im_start|>user\nWhen is the meeting?<|im_end|>\n<|im_start|>assistant\n"


def test_a_served_cartridge_is_bitwise_the_real_prefill(hybrid):
    model, tok, template = hybrid
    cart = build(model, tok, template, DOC)
    assert cart.state is not None and cart.state_shapes == tuple(model.args.state_shapes())
    question = tok.encode(QUESTION, add_special=False)
    served = model.new_cache(cart.rows + len(question))
    write_composed([cart], served)
    read = model.new_cache(cart.rows + len(question))
    ids = prefix_ids(tok, template, DOC)
    for s in range(0, len(ids), UBATCH):
        model.forward(ids[s: s + UBATCH], read)
    assert_same_cache(served, read)
    assert served.marks() == [cart.rows]  # the prefix's end: a chat rewinds no further
    np.testing.assert_array_equal(model.forward_all(question, served), model.forward_all(question, read))


def test_several_cartridges_are_refused_by_name(hybrid):
    model, tok, template = hybrid
    parts = [build(model, tok, template, d) for d in (DOC, OTHER)]
    cache = model.new_cache(4096)
    assert not documents_compose(model)
    with pytest.raises(InvalidPrefix, match="recurrent state, which cannot be composed from 2 documents"):
        write_composed(parts, cache)
    assert cache.len == 0
    check_document_count(model, 1)  # the command line and the app ask before they read a second one
    with pytest.raises(InvalidPrefix, match="attach one document at a time"):
        check_document_count(model, 2)


def test_a_stored_cartridge_loads_bitwise_with_its_state_and_a_foreign_one_is_refused(hybrid, tmp_path):
    model, tok, template = hybrid
    cart = build(model, tok, template, DOC)
    path = store.save(cart, tmp_path)
    loaded = store.load(path, model.new_cache(1), cart.fingerprint)
    for a, b in zip(cart.state[0] + cart.state[1], loaded.state[0] + loaded.state[1]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(cart.k + cart.v, loaded.k + loaded.v):
        np.testing.assert_array_equal(a, b)
    rows_only = KvCache(*model.args.kv_geometry(), 1, backend=model.backend)  # the same rows, no state
    with pytest.raises(CartridgeRefused, match="does not hold the 2 layers of this model's KV cache"):
        store.load(path, rows_only, cart.fingerprint)


def test_a_chat_behind_a_hybrid_cartridge_reopens_warm_as_the_uninterrupted_one(hybrid, tmp_path):
    model, tok, template = hybrid
    cart = build(model, tok, template, DOC)
    greedy = {"temperature": 0.0, "max_tokens": 5}
    questions = ("when is it?", "and where?", "who comes?")
    with HistoryStore(tmp_path / "history.db") as history:
        uninterrupted = ChatSession.open(history, model, sidecar_dir=tmp_path / "other", attachments=[cart],
                                         sampler=greedy)
        expected = ["".join(uninterrupted.send(q)) for q in questions]
        first = ChatSession.open(history, model, sidecar_dir=tmp_path / "sidecars", attachments=[cart],
                                 sampler=greedy)
        assert ["".join(first.send(q)) for q in questions[:2]] == expected[:2]
        first.close()
        reopened = ChatSession(history, model, first.id, sidecar_dir=tmp_path / "sidecars", attachments=[cart])
        assert reopened.resumed_positions == first.context_used and reopened.convo.prefix_rows == cart.rows
        assert "".join(reopened.send(questions[2])) == expected[2]
        assert reopened.last_turn.stats.reused_tokens > 0
        assert_same_cache(reopened.convo.cache, uninterrupted.convo.cache)
        reopened.close()
        uninterrupted.close()


def test_a_document_longer_than_its_share_is_a_fleet_serving_one_part(hybrid, tmp_path):
    model, tok, template = hybrid
    long = Document("long.txt", "text", "\n\n".join(f"Paragraph {i}: the shelf {i} holds box {i * 7}." * 3
                                                    for i in range(12)))
    read = read_for_chat(model, tok, template, long, context=512, directory=tmp_path)
    assert isinstance(read, FleetDocument) and read.per_answer == 1
    served = read.select("What does shelf 3 hold?")
    assert len(served) == 1
    cache = model.new_cache(1024)
    write_composed([a.cartridge for a in served], cache)
    assert cache.len == served[0].cartridge.rows
