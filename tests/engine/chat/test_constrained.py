"""Grammar-held conversations on a tiny random model: every turn re-armed, the reply ended by the template's
stop marker, and a lockstep batch of clones decoding exactly as the streams do one by one."""

import dataclasses
import re

import pytest

from engine.chat import ChatOptions, Conversation, Format, Template, send_batch
from engine.sampling import CHAT_DEFAULTS
from engine.sampling.grammar import Grammar

CHATML = Template(Format.CHATML)
PATTERN = r"(hi|[a-e]{2,5})!"


def convo(tiny_chat, seed=0, processor=None):
    model, tok = tiny_chat
    options = ChatOptions(capacity=256, max_tokens=32, sampler=dataclasses.replace(CHAT_DEFAULTS, seed=seed),
                          grammar=None if processor else Grammar("regex", PATTERN), processor=processor)
    return Conversation(model, tok, CHATML, options)


def test_every_turn_follows_the_grammar_and_ends_on_the_stop_marker(tiny_chat):
    c = convo(tiny_chat)
    for user in ("one", "two", "three"):
        text = "".join(c.send(user))
        assert re.fullmatch(PATTERN, text) and c.last_turn.finish_reason == "stop"
    assert c.sampler.processor.stop_id == tiny_chat[1].token_id("<|im_end|>")


def test_a_chat_takes_a_grammar_or_a_processor_not_both(tiny_chat):
    c = convo(tiny_chat)
    with pytest.raises(ValueError, match="not both"):
        ChatOptions(grammar=Grammar("regex", "a"), processor=c.sampler.processor)


def test_a_batch_of_clones_decodes_as_the_streams_do_alone(tiny_chat):
    alone = []
    for seed in range(3):
        c = convo(tiny_chat, seed)
        "".join(c.send("hello"))
        alone.append(c.last_turn.token_ids)
    first = convo(tiny_chat, 0)
    clones = [first] + [convo(tiny_chat, seed, first.sampler.processor.clone()) for seed in (1, 2)]
    results = send_batch(clones, ["hello"] * 3)
    assert [r.token_ids for r in results] == alone
    assert all(r.finish_reason == "stop" and re.fullmatch(PATTERN, r.text) for r in results)
