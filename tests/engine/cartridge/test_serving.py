"""Chats behind cartridges: bitwise what the real prefill gives, compositions, reopened chats, speculation."""

import numpy as np
import pytest

from engine.cartridge.build import build, prefix_ids
from engine.cartridge.cartridge import Cartridge, write_composed
from engine.cartridge.ingest import Document
from engine.chat import ChatOptions, Conversation, Format, Template
from engine.errors import ContextFull, InvalidPrefix, KvCacheShapeMismatch
from engine.models.model import UBATCH
from tests.engine.chat.conftest import Script

CHATML = Template(Format.CHATML)
DOC = Document("facts.md", "text", "".join(f"Item {i} weighs {i * 7 % 13} grams.\n" for i in range(22)))
OTHER = Document("notes.txt", "text", "The meeting moved to Thursday at noon.\n")


def chat(tiny, **options):
    model, tok = tiny
    return Conversation(model, tok, CHATML, ChatOptions(**({"max_tokens": 6} | options)))


def real_prefix(tiny, ids, **options):
    """A chat whose prefix was prefilled directly, in the slices a cartridge build uses."""
    c = chat(tiny, **options)
    for s in range(0, len(ids), UBATCH):
        tiny[0].forward(ids[s: s + UBATCH], c.cache)
    c.declare_prefix(len(ids))
    return c


def reply(convo, user):
    return "".join(convo.send(user))


def assert_same_cache(a, b):
    assert a.len == b.len
    for x, y in zip(a.k + a.v, b.k + b.v):
        np.testing.assert_array_equal(x[: a.len], y[: a.len])


def test_a_question_over_a_cartridge_gives_bitwise_the_logits_of_the_real_prefill(tiny):
    model, tok = tiny
    cart = build(model, tok, CHATML, DOC)
    question = tok.encode("<|im_start|>user\nWhat does item 3 weigh?<|im_end|>\n<|im_start|>assistant\n",
                          add_special=False)
    served = model.new_cache(cart.rows + len(question))
    write_composed([cart], served)
    direct = model.new_cache(cart.rows + len(question))
    ids = cart.draft_reference.tolist()
    for s in range(0, len(ids), UBATCH):
        model.forward(ids[s: s + UBATCH], direct)
    np.testing.assert_array_equal(model.forward_all(question, served), model.forward_all(question, direct))
    assert_same_cache(served, direct)


def test_a_chat_over_a_cartridge_is_the_chat_over_the_real_prefill(tiny):
    cart = build(*tiny, CHATML, DOC)
    served = chat(tiny)
    served.attach([cart])
    direct = real_prefix(tiny, cart.draft_reference.tolist())
    for user in ["What does item 3 weigh?", "And item 4?"]:
        assert reply(served, user) == reply(direct, user)
        assert served.last_turn.token_ids == direct.last_turn.token_ids
        assert_same_cache(served.cache, direct.cache)
    assert served.prefix_rows == cart.rows
    served.reset()  # the documents stay attached
    assert served.cache.len == cart.rows


def test_the_chat_after_a_prefix_carries_no_bos(tiny_models):
    model, tok = tiny_models()
    c = chat((model, tok))
    c.attach([build(model, tok, CHATML, DOC)])
    reply(c, "hi")
    assert c.history[:2] == tok.encode("<|im_start|>user", add_special=False)[:2]


def test_a_two_part_composition_cut_from_one_joint_prefill_reproduces_it(tiny):
    model, tok = tiny
    joint = build(model, tok, CHATML, Document("both", "text", DOC.text + OTHER.text))
    cut = 300  # inside the document: the second part's rows were computed attending to the first's
    parts = [Cartridge([k[a:b] for k in joint.k], [v[a:b] for v in joint.v], joint.dtype,
                       joint.draft_reference[a:b], joint.fingerprint, joint.document, joint.head_dims)
             for a, b in [(0, cut), (cut, joint.rows)]]
    composed, direct = chat(tiny), real_prefix(tiny, joint.draft_reference.tolist())
    composed.attach(parts)
    assert composed.prefix_rows == joint.rows
    assert reply(composed, "Which day?") == reply(direct, "Which day?")
    assert_same_cache(composed.cache, direct.cache)


def test_independent_cartridges_compose_in_order_each_keeping_its_rows(tiny):
    model, tok = tiny
    a, b = build(model, tok, CHATML, DOC), build(model, tok, CHATML, OTHER)
    c = chat(tiny)
    c.attach([a, b])
    assert c.prefix_rows == a.rows + b.rows
    for layer in range(model.n_layers):
        np.testing.assert_array_equal(c.cache.k[layer][a.rows: a.rows + b.rows], b.k[layer])
    reply(c, "When is the meeting?")  # the chat's tokens follow at composed_p
    assert c.cache.len > a.rows + b.rows


def test_attaching_is_refused_on_a_used_chat_a_foreign_geometry_or_a_full_context(tiny_models):
    tiny = tiny_models()
    cart = build(*tiny, CHATML, OTHER)
    used = chat(tiny)
    reply(used, "hi")
    with pytest.raises(InvalidPrefix, match="attached once"):
        used.attach([cart])
    with pytest.raises(KvCacheShapeMismatch, match="another cache type or model geometry"):
        chat(tiny_models(n_head_kv=4)).attach([cart])
    small = chat(tiny, capacity=cart.rows)
    with pytest.raises(ContextFull, match="no room is left"):
        small.attach([cart])
    assert small.cache.len == 0 and small.prefix_rows == 0
    reply(small, "hi")  # the chat stays usable


def test_a_reopened_chat_behind_its_cartridges_continues_exactly(tiny, tmp_path):
    cart = build(*tiny, CHATML, DOC)
    path = tmp_path / "chat.kv"
    uninterrupted = chat(tiny)
    uninterrupted.attach([cart])
    first = chat(tiny)
    first.attach([cart])
    first.enable_persistence(path)
    assert reply(first, "What does item 3 weigh?") == reply(uninterrupted, "What does item 3 weigh?")
    reopened = chat(tiny)
    reopened.attach([cart])
    assert reopened.enable_persistence(path) == first.cache.len  # warm: nothing prefilled again
    assert reopened.history == first.history and reopened.prefix_rows == cart.rows
    assert_same_cache(reopened.cache, first.cache)
    assert reply(reopened, "And item 4?") == reply(uninterrupted, "And item 4?")
    assert reopened.last_turn.stats.reused_tokens == len(first.history)
    assert reopened.history == uninterrupted.history


def test_a_changed_attachment_set_does_not_resume_the_old_prefix(tiny, tmp_path):
    model, tok = tiny
    a, b = build(model, tok, CHATML, DOC), build(model, tok, CHATML, OTHER)
    path = tmp_path / "chat.kv"
    first = chat(tiny)
    first.attach([a])
    first.enable_persistence(path)
    reply(first, "hi")
    for attachments in ([b], [a, b], [b, a], []):
        reopened = chat(tiny)
        if attachments:
            reopened.attach(attachments)
        assert reopened.enable_persistence(path) == 0  # another prefix: the file is not this chat's
        assert reopened.prefix_rows == sum(c.rows for c in attachments)
        first = chat(tiny)  # put the original back for the next case
        first.attach([a])
        first.enable_persistence(path)
        reply(first, "hi")


def test_speculation_drafts_quotes_from_the_attached_document(tiny, monkeypatch):
    # a fixed verify-cost table: the gate's choices (and so what is drafted) must not depend on this machine
    from engine.speculative import stream
    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: 1.0 + 0.1 * (m - 1) for m in range(1, 18)})
    model, tok = tiny
    cart = build(model, tok, CHATML, DOC)
    quote = tok.encode("Item 17 weighs 2 grams.\nItem 18 weighs 9 grams.", add_special=False)
    results = {}
    for spec in (False, True):
        c = chat(tiny, max_tokens=len(quote), speculation=spec, processor=Script(quote))
        c.attach([cart])
        results[spec] = reply(c, "Quote items 17 and 18."), c.last_turn.token_ids
    assert results[True] == results[False] and results[True][1] == quote
    sources = {s.name: s for s in c._speculation.index.source_stats()}
    assert sources["reference 1"].accepted > len(quote) // 2
