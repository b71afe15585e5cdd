"""Greedy equivalences on the real default model (SmolLM2-135M-Instruct): turn by turn == one fresh render,
reuse == fresh, lockstep batch == sequential. Replies are kept short; the model's kernels are the slow part."""

import pytest

from engine.chat import ChatOptions, Conversation, Message, send_batch

MODEL = "smollm2-135m-instruct"
TURNS = ["What is the capital of France?", "And of Italy?", "Name a river there."]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def smollm2(real_model):
    return real_model(MODEL)


def conversation(smollm2, max_tokens=MAX_TOKENS):
    model, tok = smollm2
    return Conversation.for_model(model, ChatOptions(max_tokens=max_tokens, capacity=512), tokenizer=tok)


def history(users, replies):
    out = []
    for user, reply in zip(users, replies):
        out += [Message("user", user)] + ([Message("assistant", reply)] if reply is not None else [])
    return out


def test_three_turns_turn_by_turn_equal_one_fresh_render(smollm2):
    c = conversation(smollm2)
    replies = ["".join(c.send(user)) for user in TURNS]
    assert "Paris" in replies[0]
    fresh = conversation(smollm2)
    rendered = fresh.template.render_messages(history(TURNS, replies[:2] + [None]))
    assert "".join(fresh.send_rendered(rendered)) == replies[2]
    assert fresh.history == c.history


def test_a_second_request_prefills_only_the_new_suffix(smollm2):
    model, tok = smollm2
    c = conversation(smollm2)
    first = c.template.render_messages(history(TURNS[:1], [None]))
    reply = "".join(c.send_rendered(first))
    forwarded = len(c.last_turn.token_ids) - (c.last_turn.finish_reason == "length")  # a budget-ended
    second = c.template.render_messages(history(TURNS[:2], [reply, None]))             # reply's last token
    again = "".join(c.send_rendered(second, reuse=True))                                # was never forwarded
    stats = c.last_turn.stats
    assert stats.reused_tokens == len(tok.encode(first)) + forwarded
    assert stats.prefilled_tokens == len(tok.encode(second)) - stats.reused_tokens
    fresh = conversation(smollm2)
    assert "".join(fresh.send_rendered(second)) == again
    assert fresh.history == c.history


def test_lockstep_batch_equals_sequential_sends(smollm2):
    sequential = []
    for user in TURNS:
        c = conversation(smollm2, max_tokens=8)
        sequential.append(("".join(c.send(user)), c.last_turn.token_ids))
    convos = [conversation(smollm2, max_tokens=8) for _ in TURNS]
    results = send_batch(convos, TURNS)
    assert [(r.text, r.token_ids) for r in results] == sequential
