"""The reasoning splitter: reasoning and answer told apart per format, whatever pieces the text streams in."""

import itertools

import pytest

from engine.chat.reasoning import HARMONY, THINK, ReasoningSplitter, Thought, reasoning_format

QWEN3_REPLY = "<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello there!"
R1_REPLY = "Okay, 2 + 2 is 4.\n</think>\n\nThe answer is 4."
HARMONY_REPLY = ("<|channel|>analysis<|message|>User asks for 2+2. Simple.<|end|>"
                 "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.")


def split(fmt, pieces, prompt_tail=""):
    splitter = ReasoningSplitter(fmt, prompt_tail)
    out = [p for piece in pieces for p in splitter.push(piece)] + splitter.finish()
    reasoning = "".join(p for p in out if isinstance(p, Thought))
    answer = "".join(p for p in out if not isinstance(p, Thought))
    return reasoning, answer


def every_split(text, cuts=2):
    """`text` cut at every choice of `cuts` positions (markers split at every boundary)."""
    for points in itertools.combinations(range(1, len(text)), cuts):
        bounds = (0, *points, len(text))
        yield [text[a:b] for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("fmt, text, tail, expected", [
    (THINK, QWEN3_REPLY, "<|im_start|>assistant\n", ("The user greets me.\nI greet back.", "Hello there!")),
    (THINK, R1_REPLY, "<｜Assistant｜><think>\n", ("Okay, 2 + 2 is 4.", "The answer is 4.")),
    (HARMONY, HARMONY_REPLY, "<|start|>assistant", ("User asks for 2+2. Simple.", "2 + 2 = 4.")),
    # a template that closed the reasoning in the prompt (thinking off): all answer
    (THINK, "Hi!", "<think>\n\n</think>\n\n", ("", "Hi!")),
    # a reply that never opens its reasoning is its answer, unchanged
    (THINK, "  <b>no thinking</b>", "<|im_start|>assistant\n", ("", "  <b>no thinking</b>")),
    (HARMONY, "plain answer", "<|start|>assistant", ("", "plain answer")),
    # cut inside the reasoning (a token limit): what there is is reasoning, and the marker's start is text
    (THINK, "<think>\nstill thinking </thi", "", ("still thinking </thi", "")),
    (THINK, "<thi", "", ("", "<thi")),
])
def test_split_is_the_same_at_every_token_boundary(fmt, text, tail, expected):
    assert split(fmt, [text], tail) == expected
    for pieces in every_split(text, 1):
        assert split(fmt, pieces, tail) == expected, pieces
    for pieces in every_split(text, 2):
        assert split(fmt, pieces, tail) == expected, pieces


def test_character_by_character_streams_reasoning_before_the_answer():
    splitter = ReasoningSplitter(THINK)
    out = [p for ch in QWEN3_REPLY for p in splitter.push(ch)] + splitter.finish()
    kinds = [isinstance(p, Thought) for p in out]
    assert kinds == sorted(kinds, reverse=True)  # every reasoning piece comes before the first answer piece
    assert "".join(out) == "The user greets me.\nI greet back.Hello there!"
    assert not any("<" in p for p in out if isinstance(p, Thought))  # no marker leaks into the reasoning


def test_state_follows_the_reply():
    splitter = ReasoningSplitter(THINK, "<|im_start|>assistant\n")
    assert not splitter.in_reasoning
    splitter.push("<think>")
    assert splitter.in_reasoning
    splitter.push("hmm</think>")
    assert not splitter.in_reasoning


def test_format_from_the_template():
    assert reasoning_format("{{ '<|im_start|>' }}{% if x %}<think>{% endif %}</think>") is THINK
    assert reasoning_format("<|start|>assistant<|channel|>analysis<|message|>") is HARMONY
    assert reasoning_format("{{ '<|im_start|>' + message.content }}") is None
    assert reasoning_format(None) is None
