"""A long prompt is prefilled in the model's slices of UBATCH tokens: progress is reported between them and
a stop there ends the turn, leaving the conversation as consistent (and resendable) as a stop while
decoding does. On the tiny byte-level model one character is one token."""

import threading

from engine.chat import ChatOptions, Conversation, Format, Message, Template
from engine.models.model import UBATCH

CHATML = Template(Format.CHATML)
LONG = "x" * (2 * UBATCH + 300)


def chat(tiny_chat):
    model, tok = tiny_chat
    return Conversation(model, tok, CHATML, ChatOptions(capacity=4 * UBATCH, max_tokens=4))


def test_progress_comes_between_slices_and_changes_nothing_in_the_reply(tiny_chat):
    render = CHATML.render_messages([Message("user", LONG)])
    seen = []
    c = chat(tiny_chat)
    text = "".join(c.send_rendered(render, on_prefill=lambda done, total: seen.append((done, total))))
    total = c.last_turn.stats.prefilled_tokens
    assert total > 2 * UBATCH
    assert seen == [(0, total), (UBATCH, total), (2 * UBATCH, total), (total, total)]
    plain = chat(tiny_chat)
    assert "".join(plain.send_rendered(render)) == text and plain.history == c.history


def stop_at(cancel, fed):
    def on_prefill(done, total):
        if done >= fed:
            cancel.set()
    return on_prefill


def test_a_stop_during_a_reused_render_keeps_what_was_fed_and_a_resend_resumes_from_it(tiny_chat):
    render = CHATML.render_messages([Message("user", LONG)])
    cancel = threading.Event()
    c = chat(tiny_chat)
    assert "".join(c.send_rendered(render, cancel, reuse=True, on_prefill=stop_at(cancel, UBATCH))) == ""
    turn = c.last_turn
    assert turn.finish_reason == "cancelled" and turn.stats.prefilled_tokens == UBATCH
    assert c.cache.len == len(c.history) == UBATCH and turn.stats.ttft_ms == 0
    again = "".join(c.send_rendered(render, reuse=True))
    assert c.last_turn.stats.reused_tokens == UBATCH
    fresh = chat(tiny_chat)
    assert "".join(fresh.send_rendered(render)) == again and fresh.history == c.history


def test_a_stop_during_a_new_turn_leaves_the_conversation_as_before_it(tiny_chat):
    c, uninterrupted = chat(tiny_chat), chat(tiny_chat)
    first = "".join(c.send("hi"))
    assert "".join(uninterrupted.send("hi")) == first
    history, cached = c.history, c.cache.len
    cancel = threading.Event()
    assert "".join(c.send(LONG, cancel, on_prefill=stop_at(cancel, UBATCH))) == ""
    assert c.last_turn.finish_reason == "cancelled"
    assert c.history == history and c.cache.len == cached
    assert "".join(c.send("and then?")) == "".join(uninterrupted.send("and then?"))
