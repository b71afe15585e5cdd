"""Conversation mechanics on a tiny random model: turns, stops, budgets, cancellation, reuse, warm caches,
preloaded prefixes and the lockstep batch. Scripted processors choose the replies where a test needs
particular tokens."""

import threading

import numpy as np
import pytest

from engine.chat import (ChatOptions, Conversation, JinjaTemplate, Message, Template, Format, WarmState,
                         send_batch, send_batch_rendered)
from engine.errors import AllTokensMasked, ContextFull, InvalidPrefix
from engine.sampling import LogitProcessor, SamplerConfig
from tests.engine.chat.conftest import Script

CHATML = Template(Format.CHATML)


class MaskAll(LogitProcessor):
    def process(self, logits, history):
        logits[:] = -np.inf

    def commit(self, token):
        pass


def ids(tok, text):
    return tok.encode(text, add_special=False)


def chat(tiny_chat, **options):
    model, tok = tiny_chat
    return Conversation(model, tok, CHATML, ChatOptions(**options))


def reply(convo, user, cancel=None):
    return "".join(convo.send(user, cancel))


def test_a_turn_ends_at_the_stop_marker_which_is_never_committed(tiny_chat):
    model, tok = tiny_chat
    end = tok.token_id("<|im_end|>")
    script = Script(ids(tok, "Hello!") + [end], ids(tok, "Bye.") + [end])
    c = chat(tiny_chat, processor=script)
    assert reply(c, "hi") == "Hello!"
    first = c.last_turn
    assert first.finish_reason == "stop" and first.token_ids == ids(tok, "Hello!")
    assert first.stats.prompt_tokens == first.stats.prefilled_tokens == len(tok.encode(CHATML.render_turn("hi")))
    assert c.cache.len == len(c.history)
    assert reply(c, "and?") == "Bye."
    # turn by turn, the cache holds what a fresh render of the same history holds
    rendered = CHATML.render_messages([Message("user", "hi"), Message("assistant", "Hello!"), Message("user", "and?")])
    assert c.history == tok.encode(rendered) + ids(tok, "Bye.")
    assert c.last_turn.stats.reused_tokens == first.stats.prompt_tokens + len(first.token_ids)
    assert c.messages == [Message("user", "hi"), Message("assistant", "Hello!"),
                          Message("user", "and?"), Message("assistant", "Bye.")]
    assert script.commits == 7 + 5  # the processor saw every sampled token, stop tokens included


def test_token_budget_leaves_the_last_token_to_the_next_prefill(tiny_chat):
    c = chat(tiny_chat, max_tokens=3)
    reply(c, "hi")
    assert c.last_turn.finish_reason == "length" and c.last_turn.stats.generated_tokens == 3
    assert c.cache.len == len(c.history) - 1
    new = len(c.tokenizer.encode(CHATML.render_turn("more", first=False), add_special=False))
    reply(c, "more")
    assert c.last_turn.stats.prefilled_tokens == 1 + new


def test_reply_tokens_counts_the_reply_as_it_streams_even_through_a_held_back_character(tiny_chat):
    model, tok = tiny_chat
    end = tok.token_id("<|im_end|>")
    c = chat(tiny_chat, processor=Script(ids(tok, "café!") + [end], ids(tok, "ok") + [end]))
    seen = [(piece, c.reply_tokens) for piece in c.send("hi")]
    # "é" is two byte tokens: the first completes no text, so the count runs ahead of the pieces
    assert seen == [("c", 1), ("a", 2), ("f", 3), ("é", 5), ("!", 6)]
    assert c.reply_tokens == len(c.last_turn.token_ids) == 6
    assert [count for _, count in ((p, c.reply_tokens) for p in c.send("again"))] == [1, 2]  # from 0 again


def test_stop_sequences_and_extra_stop_ids(tiny_chat):
    model, tok = tiny_chat
    c = chat(tiny_chat, stop_sequences=("xyz", "lo"), processor=Script(ids(tok, "Hello there")))
    assert reply(c, "hi") == "Hell"  # the "o" completing "lo" is neither streamed nor committed
    assert c.last_turn.finish_reason == "stop_sequence" and c.last_turn.fired_stop == 1
    assert c.history[-1] == ids(tok, "l")[0]
    stop_at = ids(tok, "!")[0]
    c = chat(tiny_chat, extra_stop_ids=(stop_at,), processor=Script(ids(tok, "Wow!!")))
    assert reply(c, "hi") == "Wow" and c.last_turn.finish_reason == "stop" and c.last_turn.fired_stop is None


def test_a_multibyte_stop_sequence_spanning_tokens(tiny_chat):
    model, tok = tiny_chat
    c = chat(tiny_chat, stop_sequences=("fé",), processor=Script(ids(tok, "café!")))
    # "é" is two byte tokens: the second completes "fé", so only the first is committed, and the
    # unfinished character it starts is held back, not shown as U+FFFD
    assert reply(c, "hi") == "caf"
    assert c.last_turn.token_ids == ids(tok, "café")[:-1]
    assert c.last_turn.fired_stop == 0


def test_cancel_between_tokens(tiny_chat):
    cancel = threading.Event()
    c = chat(tiny_chat, max_tokens=50)
    stream = c.send("hi", cancel)
    next(stream)
    cancel.set()
    list(stream)
    assert c.last_turn.finish_reason == "cancelled" and c.last_turn.stats.generated_tokens == 1
    cancel.clear()
    reply(c, "again")  # still resendable
    assert c.last_turn.finish_reason == "length"


class CancelAfter(Script):
    """A Script that stops the turn once it has committed `after` tokens, as Esc between two of them."""

    def __init__(self, cancel, after, *turns):
        super().__init__(*turns)
        self.cancel, self.after = cancel, after

    def commit(self, token):
        super().commit(token)
        if self.pos == self.after:
            self.cancel.set()


@pytest.mark.parametrize("speculation", [False, True])
def test_a_stop_inside_a_multibyte_character_keeps_only_whole_characters(tiny_chat, speculation):
    model, tok = tiny_chat
    cancel = threading.Event()
    script = CancelAfter(cancel, len(ids(tok, "caf")) + 1, ids(tok, "café au lait"))  # after é's first byte
    c = chat(tiny_chat, processor=script, max_tokens=50, speculation=speculation)
    assert reply(c, "hi", cancel) == "caf"
    assert c.last_turn.finish_reason == "cancelled" and c.last_turn.text == "caf"
    assert c.messages[-1].content == "caf"  # what is stored has no U+FFFD either


def test_closing_the_stream_cancels_the_turn(tiny_chat):
    c = chat(tiny_chat, max_tokens=50)
    stream = c.send("hi")
    next(stream)
    next(stream)
    stream.close()
    assert c.last_turn.finish_reason == "cancelled" and c.last_turn.stats.generated_tokens == 2
    assert c.cache.len == len(c.history) - 1


def test_context_full_is_a_clear_error_that_changes_nothing(tiny_chat):
    c = chat(tiny_chat, capacity=40, max_tokens=2)
    reply(c, "hi")
    before, cache_len = c.history, c.cache.len
    with pytest.raises(ContextFull, match="context full"):
        reply(c, "a message far too long for the forty positions this tiny context holds")
    assert c.history == before and c.cache.len == cache_len


def test_decoding_into_a_full_context_ends_the_turn(tiny_chat):
    prompt = len(tiny_chat[1].encode(CHATML.render_turn("hi")))
    c = chat(tiny_chat, capacity=prompt + 4, max_tokens=50)
    reply(c, "hi")
    assert c.last_turn.finish_reason == "context" and c.last_turn.stats.generated_tokens == 5
    assert c.cache.len == c.cache.capacity


def test_reuse_prefills_only_the_new_suffix_and_replies_as_a_fresh_conversation(tiny_chat):
    model, tok = tiny_chat
    c = chat(tiny_chat, max_tokens=6)
    first = CHATML.render_messages([Message("user", "hi")])
    text = "".join(c.send_rendered(first))
    history = [Message("user", "hi"), Message("assistant", text), Message("user", "and then?")]
    second = CHATML.render_messages(history)
    again = "".join(c.send_rendered(second, reuse=True))
    stats = c.last_turn.stats
    assert stats.reused_tokens == len(tok.encode(first)) + 5  # the 6th reply token was never forwarded
    assert stats.prefilled_tokens == len(tok.encode(second)) - stats.reused_tokens
    fresh = chat(tiny_chat, max_tokens=6)
    assert "".join(fresh.send_rendered(second)) == again
    assert fresh.history == c.history


def test_reuse_rewinds_a_diverging_history(tiny_chat):
    c = chat(tiny_chat, max_tokens=4)
    "".join(c.send_rendered(CHATML.render_messages([Message("user", "hi there")])))
    edited = CHATML.render_messages([Message("user", "hi you")])
    "".join(c.send_rendered(edited, reuse=True))
    assert c.last_turn.stats.reused_tokens == len(c.tokenizer.encode("<|im_start|>user\nhi "))  # up to the edit
    fresh = chat(tiny_chat, max_tokens=4)
    "".join(fresh.send_rendered(edited))
    assert fresh.history == c.history


def test_a_warm_cache_resumes_where_it_stopped(tiny_chat):
    model, tok = tiny_chat
    c = chat(tiny_chat, max_tokens=4)
    first = CHATML.render_messages([Message("user", "hi")])
    text = "".join(c.send_rendered(first))
    state = c.take_cache()
    with pytest.raises(RuntimeError, match="taken"):
        reply(c, "more")
    second = CHATML.render_messages([Message("user", "hi"), Message("assistant", text), Message("user", "more")])
    warm = Conversation(model, tok, CHATML, ChatOptions(max_tokens=4), warm=state)
    out = "".join(warm.send_rendered(second, reuse=True))
    assert warm.last_turn.stats.reused_tokens == len(tok.encode(first)) + 3  # the 4th token was never forwarded
    fresh = chat(tiny_chat, max_tokens=4)
    assert "".join(fresh.send_rendered(second)) == out


def test_warm_tokens_clamp_the_cache(tiny_chat):
    model, tok = tiny_chat
    cache = model.new_cache(64)
    model.forward(ids(tok, "abcdef"), cache)
    c = Conversation(model, tok, CHATML, warm=WarmState(cache, ids(tok, "abc")))
    assert c.cache.len == 3 and c.history == ids(tok, "abc")


def test_a_preloaded_prefix_is_never_rewound(tiny_chat):
    model, tok = tiny_chat
    c = chat(tiny_chat, max_tokens=3)
    model.forward(ids(tok, "DOCUMENT"), c.cache)
    with pytest.raises(InvalidPrefix):
        c.declare_prefix(3)
    c.declare_prefix(8)
    with pytest.raises(InvalidPrefix):
        c.declare_prefix(8)
    "".join(c.send_rendered(CHATML.render_messages([Message("user", "hi")])))
    "".join(c.send_rendered(CHATML.render_messages([Message("user", "bye")]), reuse=True))
    assert c.cache.len >= 8 and c.history[:1] == tok.encode("<|im_start|>")
    c.reset()
    assert c.cache.len == 8 and c.history == []
    state = c.take_cache()
    assert state.prefix_rows == 8 and Conversation(model, tok, CHATML, warm=state).prefix_rows == 8


def test_a_jinja_template_conversation_reuses_its_cached_prefix(tiny_chat):
    model, tok = tiny_chat
    source = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    c = Conversation(model, tok, JinjaTemplate(source), ChatOptions(max_tokens=4, system="Be brief."))
    reply(c, "hi")
    reply(c, "more")
    assert c.last_turn.stats.reused_tokens > c.last_turn.stats.prefilled_tokens
    assert [m.role for m in c.messages] == ["user", "assistant"] * 2


def test_seeded_sampling_is_reproducible_across_conversations(tiny_chat):
    cfg = SamplerConfig(temperature=0.9, top_k=20, seed=11)
    a, b = chat(tiny_chat, sampler=cfg, max_tokens=8), chat(tiny_chat, sampler=cfg, max_tokens=8)
    assert reply(a, "hi") == reply(b, "hi")


USERS = ["hi", "what is two and two?", "tell me"]


def test_lockstep_batch_equals_sequential_sends(tiny_chat):
    sequential = []
    for user in USERS:
        c = chat(tiny_chat, max_tokens=6)
        sequential.append((reply(c, user), c.history))
    convos = [chat(tiny_chat, max_tokens=6) for _ in USERS]
    pieces = [[] for _ in USERS]
    results = send_batch(convos, USERS, sinks=[p.append for p in pieces])
    assert [(r.text, c.history) for r, c in zip(results, convos)] == sequential
    assert ["".join(p) for p in pieces] == [r.text for r in results]
    # the next turn goes through the batch again, reusing each cache
    again = send_batch_rendered(convos, [CHATML.render_messages([Message("user", u), Message("assistant", r.text),
                                                                 Message("user", "ok")])
                                         for u, r in zip(USERS, results)])
    assert all(r.error is None and r.stats.reused_tokens > 0 for r in again)


def test_a_failing_stream_is_isolated(tiny_chat):
    model, tok = tiny_chat

    def broken_sink(text):
        raise BrokenPipeError("client gone")

    healthy, masked, small, gone = (chat(tiny_chat, max_tokens=5), chat(tiny_chat, processor=MaskAll()),
                                    chat(tiny_chat, capacity=8), chat(tiny_chat, max_tokens=5))
    results = send_batch([healthy, masked, small, gone], ["hi"] * 4,
                         sinks=[lambda t: None, lambda t: None, lambda t: None, broken_sink])
    assert results[0].error is None and results[0].finish_reason == "length"
    assert isinstance(results[1].error, AllTokensMasked)
    assert isinstance(results[2].error, ContextFull)
    assert isinstance(results[3].error, BrokenPipeError) and results[3].finish_reason == "error"
    alone = chat(tiny_chat, max_tokens=5)
    assert reply(alone, "hi") == results[0].text
    for c in (masked, small, gone):  # every stream stays consistent
        assert c.cache.len <= c.prefix_rows + len(c.history) <= c.cache.len + 1


def test_a_failing_batched_forward_ends_every_stream(tiny_chat, monkeypatch):
    model, tok = tiny_chat
    convos = [chat(tiny_chat, max_tokens=5) for _ in range(2)]

    def fail(tokens, caches):
        raise MemoryError("out of memory")

    monkeypatch.setattr(model, "decode_batch", fail)
    with pytest.raises(MemoryError):
        send_batch(convos, ["hi", "yo"])
    monkeypatch.undo()
    for c in convos:
        assert c.last_turn.finish_reason == "error" and c.cache.len == len(c.history) - 1
        reply(c, "again")


def test_batch_arguments_are_checked(tiny_chat):
    c = chat(tiny_chat)
    shared = MaskAll()
    twins = [chat(tiny_chat, processor=shared), chat(tiny_chat, processor=shared)]
    for convos, users in (([], []), ([c], ["a", "b"]), ([c, c], ["a", "b"]), (twins, ["a", "b"])):
        with pytest.raises(ValueError):
            send_batch(convos, users)


@pytest.fixture(scope="module")
def varied_chat(tmp_path_factory):
    """A tiny model with an untied output matrix: its sampled replies vary (the tied one repeats one token)."""
    from engine.models import load_model
    from tests.synthetic import write_tiny_model

    path = tmp_path_factory.mktemp("varied") / "tiny.gguf"
    write_tiny_model(path, "qwen2", tokenizer=True, tied=False, seed=1)
    return load_model(path)


def test_a_seeded_reply_is_the_same_from_a_fresh_or_a_reused_cache(varied_chat):
    """The prompt's last token is fed alone, so a resent prompt (the cache keeps all of it but that token)
    starts the reply from the same logits as a fresh prefill, and the seeded draws pick the same tokens."""
    for seed in range(6):  # the prefill path's last row differs in low bits: some seeds would pick otherwise
        options = ChatOptions(capacity=256, max_tokens=24, sampler=SamplerConfig(temperature=1.0, seed=seed))
        convo = Conversation.for_model(varied_chat, options)
        ids = convo.tokenizer.encode(convo.template.render_messages([Message("user", "pick")]))
        fresh = "".join(convo.send_tokens(ids, reuse=True))
        convo.reconfigure(options)  # the same seed again
        resent = "".join(convo.send_tokens(ids, reuse=True))
        assert convo.last_turn.stats.reused_tokens == len(ids) - 1
        assert resent == fresh and len(fresh) > 4, seed
