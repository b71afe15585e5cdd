"""A chat's equivalences, asserted on any model given as (model, tokenizer) over the byte-level ChatML vocabulary:
a reopened chat continues bitwise as the uninterrupted one, and a chat over a cartridge is bitwise the chat over
the real prefill (tests/engine/test_deepseek2.py and test_glm4moe.py run them on their families)."""

from engine.cartridge.build import build
from engine.cartridge.ingest import Document
from engine.chat import ChatOptions, Conversation, Format, Template
from engine.models.model import UBATCH
from tests.row_wise import assert_same_cache

CHATML = Template(Format.CHATML)


def chat(chat_model, **options) -> Conversation:
    model, tokenizer = chat_model
    if options.get("speculation"):
        model.rows_ready(model.new_cache(1), wait=True)  # a speculative reply needs its verify kernels ready
    return Conversation(model, tokenizer, CHATML, ChatOptions(max_tokens=6, **options))


def reply(convo: Conversation, user: str) -> str:
    return "".join(convo.send(user))


def assert_a_reopened_chat_continues_as_the_uninterrupted_one(chat_model, tmp_path, **options):
    """`options`: the reopened chat's (the others' are the defaults)."""
    path = tmp_path / "chat.kv"
    plain = chat(chat_model)
    expected = [reply(plain, u) for u in ("hi", "more", "again")]
    saved = chat(chat_model)
    saved.enable_persistence(path)
    assert [reply(saved, u) for u in ("hi", "more")] == expected[:2]
    reopened = chat(chat_model, **options)
    assert reopened.enable_persistence(path) == saved.cache.len
    assert_same_cache(reopened.cache, saved.cache)
    assert reply(reopened, "again") == expected[2]
    assert reopened.last_turn.token_ids == plain.last_turn.token_ids
    assert reopened.last_turn.stats.reused_tokens == len(saved.history)
    return reopened


def assert_a_chat_over_a_cartridge_is_the_chat_over_the_real_prefill(chat_model, **options):
    model, tokenizer = chat_model
    cart = build(model, tokenizer, CHATML, Document("facts.md", "text", "Item 3 weighs 8 grams.\n" * 6))
    served = chat(chat_model, **options)
    served.attach([cart])
    direct = chat(chat_model)
    ids = cart.draft_reference.tolist()
    for s in range(0, len(ids), UBATCH):
        model.forward(ids[s: s + UBATCH], direct.cache)
    direct.declare_prefix(len(ids))
    for user in ["What does item 3 weigh?", "And item 4?"]:
        assert reply(served, user) == reply(direct, user)
        assert served.last_turn.token_ids == direct.last_turn.token_ids
        assert_same_cache(served.cache, direct.cache)
    return served
