"""Conversation.enable_persistence: a chat saved to its KV sidecar reopens in a new process's Conversation
(here: a new Conversation and cache) and continues exactly as the uninterrupted one, with zero re-prefill."""

import numpy as np
import pytest

from engine.chat import ChatOptions, Conversation, Format, Message, Template
from engine.kv import persist

CHATML = Template(Format.CHATML)


def chat(tiny_chat, **options):
    model, tok = tiny_chat
    return Conversation(model, tok, CHATML, ChatOptions(**({"max_tokens": 5} | options)))


def reply(convo, user):
    return "".join(convo.send(user))


def assert_same_cache(a, b):
    assert a.len == b.len
    for x, y in zip(a.k + a.v, b.k + b.v):
        assert np.array_equal(x[: a.len], y[: a.len])


def test_a_reopened_chat_continues_as_the_uninterrupted_one(tiny_chat, tmp_path):
    path = tmp_path / "chat.kv"
    plain = chat(tiny_chat)
    expected = [reply(plain, u) for u in ("hi", "more", "again")]
    saved = chat(tiny_chat)
    assert saved.enable_persistence(path) == 0
    assert [reply(saved, u) for u in ("hi", "more")] == expected[:2]
    history = saved.history
    reopened = chat(tiny_chat)
    assert reopened.enable_persistence(path) == len(history) == saved.cache.len
    assert reopened.history == history
    assert_same_cache(reopened.cache, saved.cache)
    assert reply(reopened, "again") == expected[2]
    assert reopened.last_turn.stats.reused_tokens == len(history)
    assert reopened.history == plain.history


def test_a_rewound_history_is_rewritten_from_the_common_prefix(tiny_chat, tmp_path):
    path = tmp_path / "chat.kv"
    c = chat(tiny_chat)
    c.enable_persistence(path)
    first = CHATML.render_messages([Message("user", "hi")])
    "".join(c.send_rendered(first))
    other = CHATML.render_messages([Message("user", "bye")])
    "".join(c.send_rendered(other, reuse=True))
    assert c.last_turn.stats.reused_tokens < len(c.history)  # the reconcile rewound the cache
    reopened = chat(tiny_chat)
    assert reopened.enable_persistence(path) == c.cache.len
    assert reopened.history == c.history
    assert_same_cache(reopened.cache, c.cache)


def test_reset_forgets_the_saved_chat(tiny_chat, tmp_path):
    path = tmp_path / "chat.kv"
    c = chat(tiny_chat)
    c.enable_persistence(path)
    reply(c, "hi")
    c.reset()
    assert chat(tiny_chat).enable_persistence(path) == 0


def test_a_preloaded_prefix_is_saved_and_resumed(tiny_chat, tmp_path):
    model, tok = tiny_chat
    path = tmp_path / "chat.kv"
    c = chat(tiny_chat)
    model.forward(tok.encode("DOCUMENT", add_special=False), c.cache)
    c.declare_prefix(8)
    c.enable_persistence(path)
    assert chat(tiny_chat).enable_persistence(path) == 8  # the prefix is saved before any turn (waits for the writer)
    reply(c, "hi")
    assert path.read_bytes()[:8] == b"FUXKV005"
    reopened = chat(tiny_chat)  # no prefix of its own: the file's comes back with it
    assert reopened.enable_persistence(path) == c.cache.len
    assert reopened.prefix_rows == 8 and reopened.history == c.history
    assert_same_cache(reopened.cache, c.cache)


def test_a_damaged_record_resumes_the_prefix_before_it_and_the_next_turn_rewrites_the_rest(tiny_chat, tmp_path):
    path = tmp_path / "chat.kv"
    c = chat(tiny_chat)
    c.enable_persistence(path)
    reply(c, "hi")
    reply(c, "more")
    assert chat(tiny_chat).enable_persistence(path) == c.cache.len  # saved whole (this waits for the writer)
    damaged_at = c.cache.len // 2
    data = bytearray(path.read_bytes())
    data[persist.header_size(c.cache) + damaged_at * persist.bytes_per_token(c.cache) + 9] ^= 0x40
    path.write_bytes(bytes(data))

    reopened = chat(tiny_chat)
    assert reopened.enable_persistence(path) == damaged_at
    assert reopened.history == c.history[:damaged_at]
    for x, y in zip(reopened.cache.k + reopened.cache.v, c.cache.k + c.cache.v):
        assert np.array_equal(x[:damaged_at], y[:damaged_at])
    "".join(reopened.send_tokens(c.history, reuse=True))  # the caller renders the whole chat again
    assert reopened.last_turn.stats.reused_tokens == damaged_at
    again = chat(tiny_chat)
    assert again.enable_persistence(path) == reopened.cache.len > c.cache.len
    assert again.history == reopened.history
    assert_same_cache(again.cache, reopened.cache)


def test_a_foreign_file_starts_over_and_persistence_is_enabled_once(tiny_chat, tmp_path):
    path = tmp_path / "chat.kv"
    path.write_bytes(b"FUXKV001" + bytes(300))
    c = chat(tiny_chat)
    assert c.enable_persistence(path) == 0
    with pytest.raises(RuntimeError, match="once"):
        c.enable_persistence(path)
    reply(c, "hi")
    assert chat(tiny_chat).enable_persistence(path) == c.cache.len
    talked = chat(tiny_chat)
    reply(talked, "hi")
    with pytest.raises(RuntimeError, match="once"):
        talked.enable_persistence(tmp_path / "other.kv")


def test_smollm2_reopened_from_its_sidecar_replies_as_the_uninterrupted_chat(real_model, tmp_path):
    model, tok = real_model("smollm2-135m-instruct")
    turns = ("What is the capital of France?", "And of Italy?", "Name a river there.")

    def smollm2():
        return Conversation.for_model(model, ChatOptions(max_tokens=8, capacity=256), tokenizer=tok)

    uninterrupted = smollm2()
    expected = [reply(uninterrupted, user) for user in turns]
    path = tmp_path / "chat.kv"
    saved = smollm2()
    saved.enable_persistence(path)
    assert [reply(saved, user) for user in turns[:2]] == expected[:2]
    reopened = smollm2()  # the app closed, and reopens
    resumed = reopened.enable_persistence(path)
    print(f"\nSmolLM2 chat resumed {resumed} positions from a {path.stat().st_size} byte sidecar "
          f"({persist.bytes_per_token(reopened.cache)} bytes/token)")
    assert resumed == saved.cache.len == len(reopened.history) > 20
    assert reply(reopened, turns[2]) == expected[2]
    assert reopened.last_turn.stats.reused_tokens == resumed  # zero re-prefill
    assert reopened.history == uninterrupted.history


def test_a_turn_never_waits_for_its_sidecar_write(tiny_chat, tmp_path, monkeypatch):
    import threading

    from engine.kv.sidecar_writer import WRITER

    disk = threading.Event()  # the "disk" accepts writes only once set
    real_apply = persist.apply
    monkeypatch.setattr(persist, "apply", lambda path, update: disk.wait() and real_apply(path, update))
    c = chat(tiny_chat)
    path = tmp_path / "chat.kv"
    c.enable_persistence(path)
    reply(c, "hi")
    reply(c, "and again")  # both turns ended while their writes were still held back
    assert path.stat().st_size == persist.header_size(c.cache)
    disk.set()
    WRITER.flush()
    reopened = chat(tiny_chat)
    assert reopened.enable_persistence(path) == c.cache.len
    assert_same_cache(reopened.cache, c.cache)
