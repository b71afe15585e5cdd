"""A chat that outgrows its context (engine.chat.window, through the session layer): drop_oldest keeps the
system prompt and the newest turns that fit with room for the reply, stop refuses clearly, a message that
alone cannot fit is refused under both, and a message far beyond the context is judged by its length alone,
never rendered or tokenized."""

import pytest

from engine.chat import Message
from engine.chat.window import fit_context, longest_token, reply_room
from engine.errors import ContextFull, HistoryError, InvalidContextPolicy
from engine.history.store import HistoryStore
from engine.serving.session import ChatSession

OVERHEAD = 4  # the fake template's tokens per message


def fake_encode(messages):
    """One token per character plus OVERHEAD per message (so longest=1 bounds it from below)."""
    return [0] * sum(len(m.content) + OVERHEAD for m in messages)


def chat_messages(turns: int, size: int = 10) -> list[Message]:
    messages = [Message("system", "s" * size)]
    for i in range(turns):
        messages += [Message("user", f"{i}" * size), Message("assistant", "a" * size)]
    return messages + [Message("user", "q" * size)]


def fit(messages, capacity, policy="drop_oldest", max_tokens=20, encode=fake_encode, longest=1,
        previous_start=None):
    return fit_context(messages, encode, capacity=capacity, max_tokens=max_tokens, policy=policy,
                       longest=longest, previous_start=previous_start)


def test_drop_oldest_keeps_the_system_prompt_and_the_newest_turns_that_fit():
    messages = chat_messages(5)
    window = fit(messages, capacity=100)  # room 80: system (14) + u4 a4 q (42) fits, one turn more does not
    assert (window.left_out, window.left_out_turns, len(window.ids)) == (8, 4, 56)


@pytest.mark.parametrize("capacity", range(40, 200, 7))
def test_drop_oldest_drops_to_three_quarters_of_the_room_the_reply_leaves(capacity):
    messages = chat_messages(6)
    room = capacity - reply_room(capacity, 20)
    starts = [1] + [i for i, m in enumerate(messages) if m.role == "user" and i > 1]

    def first_within(limit):
        return next((s for s in starts if len(fake_encode([messages[0], *messages[s:]])) <= limit), None)

    if first_within(room) == 1:
        expected = 1  # everything fits: nothing is dropped
    else:
        expected = first_within(room - room // 4) or first_within(room) or starts[-1]
    window = fit(messages, capacity)
    assert window.start == expected and window.left_out == expected - 1


def test_the_previous_start_stays_while_it_fits_so_the_cached_prompt_is_reused():
    messages = chat_messages(5)  # 14 tokens a message; capacity 120: room 100, three quarters 75
    first = fit(messages, capacity=120)
    assert first.start == 9 and len(first.ids) == 56  # system + u4 a4 q: within 75
    grown = messages + [Message("assistant", "a" * 10), Message("user", "r" * 10)]
    assert fit(grown, capacity=120).start == 11  # without the previous start: down to 75 again
    assert fit(grown, capacity=120, previous_start=9).start == 9  # 84 tokens: still within the room
    longer = grown + [Message("assistant", "a" * 10), Message("user", "t" * 10)]
    assert fit(longer, capacity=120, previous_start=9).start == 13  # 112 > 100: it moves on


def test_stop_refuses_a_conversation_that_does_not_fit_and_says_what_to_do():
    messages = chat_messages(5)
    assert fit(messages, capacity=200, policy="stop").left_out == 0
    with pytest.raises(ContextFull, match=r"needs 168 tokens but the context holds 150 \(context policy: stop\)"):
        fit(messages, capacity=150, policy="stop")


@pytest.mark.parametrize("policy", ["drop_oldest", "stop"])
def test_a_message_that_alone_cannot_fit_is_refused_under_both_policies(policy):
    messages = chat_messages(2) + [Message("assistant", "a"), Message("user", "q" * 85)]
    with pytest.raises(ContextFull, match="the message needs 103 tokens with the system prompt, and the "
                                          "context holds 100"):
        fit(messages, capacity=100, policy=policy)


def test_the_last_turn_alone_gets_what_is_left_when_it_leaves_less_than_the_reply_room():
    messages = chat_messages(2) + [Message("assistant", "a"), Message("user", "q" * 70)]
    window = fit(messages, capacity=100)  # 88 tokens: over the room of 80, under the context
    assert len(window.ids) == 88 and window.left_out_turns == 3


def test_a_message_far_beyond_the_context_is_judged_by_its_length_without_being_rendered():
    huge = "x" * 50_000_000
    rendered = []

    def encode(messages):
        assert all(len(m.content) <= 100 * 8 for m in messages), "rendered a message that cannot fit"
        rendered.append(len(messages))
        return fake_encode(messages)

    old_huge = [Message("user", huge), Message("assistant", "ok"), Message("user", "and now?")]
    window = fit(old_huge, capacity=100, encode=encode, longest=8)
    assert window.left_out_turns == 1 and rendered == [1]
    for policy in ("drop_oldest", "stop"):
        with pytest.raises(ContextFull, match="the message is 50,000,000 characters long: at least 6,250,000 "
                                              "tokens with the system prompt, and the context holds 100"):
            fit([Message("user", "hi"), Message("assistant", "ok"), Message("user", huge)], 100, policy,
                encode=encode, longest=8)
        with pytest.raises(ContextFull, match="context policy: stop"):
            fit(old_huge, 100, "stop", encode=encode, longest=8)


def test_an_unknown_policy_is_refused():
    with pytest.raises(InvalidContextPolicy, match="context_policy must be one of drop_oldest, stop, got 'all'"):
        fit(chat_messages(1), capacity=100, policy="all")


# -- through the session, on a tiny model with a 128-position context --------------------------------

SMALL = {"temperature": 0.0, "max_tokens": 8, "ctx": 128}


@pytest.fixture
def store(tmp_path):
    with HistoryStore(tmp_path / "history.db") as store:
        yield store


def open_session(store, model, tmp_path, **sampler):
    return ChatSession.open(store, model, sidecar_dir=tmp_path / "sidecars", system_prompt="Be brief.",
                            sampler=SMALL | sampler)


def test_a_session_leaves_out_the_oldest_turns_and_keeps_them_stored(tiny_chat_model, store, tmp_path):
    s = open_session(store, tiny_chat_model, tmp_path)
    windows = []
    for i in range(6):
        "".join(s.send(f"message number {i}"))
        windows.append((s.messages()[-1]["meta"]["kept_from"], s.last_turn.stats.reused_tokens))
    assert s.last_window.left_out_turns > 0
    shifts = [i for i in range(1, 6) if windows[i][0] != windows[i - 1][0]]
    kept = [i for i in range(1, 6) if windows[i][0] is not None and i not in shifts]
    assert shifts and kept, windows  # a turn after a shift keeps its start and reuses the cached prompt
    assert all(windows[i][1] > 40 for i in kept)
    assert len(s.messages()) == 12 and s.messages()[0]["content"] == "message number 0"
    reply = s.messages()[-1]
    assert reply["meta"]["left_out_turns"] == s.last_window.left_out_turns
    assert s.last_turn.stats.prompt_tokens == len(s.last_window.ids) <= 128 - reply_room(128, 8)
    kept = s.convo.tokenizer.encode(s.convo.template.render_messages(
        [Message("system", "Be brief.")] + [Message(m["role"], m["content"]) for m in
                                            s.messages()[2 * s.last_window.left_out_turns:-1]]))
    assert s.last_window.ids == kept  # the system prompt and the newest turns
    assert s.branch_fill() == (len(kept) + reply["meta"]["generated_tokens"], s.last_window.left_out_turns)


def test_a_session_with_policy_stop_refuses_and_keeps_the_message(tiny_chat_model, store, tmp_path):
    s = open_session(store, tiny_chat_model, tmp_path, context_policy="stop")
    with pytest.raises(ContextFull, match="context policy: stop"):
        for i in range(5):
            "".join(s.send(f"message number {i}"))
    branch = s.messages()
    assert branch[-1]["role"] == "user" and branch[-1]["content"] == f"message number {i}" and i > 0
    assert [m["role"] for m in branch[:-1]] == ["user", "assistant"] * i


def test_a_huge_stored_message_is_left_out_without_tokenizing_it(tiny_chat_model, store, tmp_path, monkeypatch):
    s = open_session(store, tiny_chat_model, tmp_path)
    huge = "imported " * 2_000_000  # 18 MB
    store.add_message(s.id, "user", huge)
    store.add_message(s.id, "assistant", "ok")
    tokenizer = s.convo.tokenizer
    encode, bound = tokenizer.encode, 128 * longest_token(tokenizer)

    def bounded_encode(text, **kwargs):
        assert len(text) < bound + 1000, f"tokenized {len(text):,} characters for a 128-token context"
        return encode(text, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", bounded_encode)
    "".join(s.send("hello"))
    assert s.last_window.left_out_turns == 1 and s.messages()[-1]["meta"]["left_out_turns"] == 1
    with pytest.raises(ContextFull, match="the message is 18,000,000 characters long"):
        s.send(huge)
    assert s.messages()[-1]["content"] == huge  # refused, not lost


def test_a_stored_policy_that_names_none_is_refused_on_opening(tiny_chat_model, store, tmp_path):
    with pytest.raises(HistoryError, match="context_policy: expected one of drop_oldest, stop, got 'forget'"):
        store.create_conversation("tiny", sampler={"context_policy": "forget"})
    cid = store.create_conversation("tiny")  # a row the validator never saw (an older version's, a hand edit)
    store.db.execute("UPDATE conversations SET sampler = ? WHERE id = ?", ['{"context_policy": "forget"}', cid])
    with pytest.raises(InvalidContextPolicy, match="got 'forget'"):
        ChatSession(store, tiny_chat_model, cid, sidecar_dir=tmp_path / "sidecars")
