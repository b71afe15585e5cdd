"""Reasoning through a chat turn, on a tiny random model with Qwen3's reasoning markers as tokens (no
starter model reasons) and scripted replies: the reply's pieces carry reasoning apart from the answer, the
next prompt renders it as the template says, thinking off closes it in the prompt, and a thinking budget
closes it at exactly N tokens, speculative or not."""

import json

import numpy as np
import pytest

from engine.chat import ChatOptions, Conversation, Format, JinjaTemplate, Message, Template, template_for_model
from engine.chat.reasoning import HARMONY, THINK, Thought
from engine.chat.thinking_budget import ThinkingBudget
from engine.chat.tool_use import ToolUse
from engine.sampling.grammar import Grammar
from engine.speculative import stream
from engine.tools import ToolSpec
from engine.tokenize import load_tokenizer
from tests.engine.chat.conftest import Script
from tests.engine.chat.reasoning_model import QWEN3_LIKE_TEMPLATE, write_reasoning_model

QWEN3 = Template(Format.CHATML, reasoning=THINK)
REPLY = "<think>\nThe user says hi.\nGreet back.\n</think>\n\nHello!"


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    from engine.models import load_model

    model = load_model(write_reasoning_model(tmp_path_factory.mktemp("think") / "thinker.gguf"))
    return model, load_tokenizer(model.file.metadata)


@pytest.fixture(autouse=True)
def free_verify(monkeypatch):
    """Verifies priced like plain steps, so speculation drafts whatever it can."""
    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: 1.0 for m in range(1, 18)})


def scripted(tok, *texts):
    end = tok.token_id("<|im_end|>")
    return Script(*[tok.encode(t, add_special=False) + [end] for t in texts])


def split(pieces):
    pieces = list(pieces)
    return ("".join(p for p in pieces if isinstance(p, Thought)),
            "".join(p for p in pieces if not isinstance(p, Thought)))


def test_the_template_names_the_format(thinker):
    model, tok = thinker
    assert template_for_model(model.file.metadata, tok) == QWEN3  # ChatML, with <think> reasoning
    assert JinjaTemplate(QWEN3_LIKE_TEMPLATE, isolated=False).reasoning is THINK


def test_a_reply_streams_its_reasoning_apart_and_the_turn_records_both(thinker):
    model, tok = thinker
    assert len(tok.encode("<think></think>", add_special=False)) == 2  # the markers are single tokens
    c = Conversation(model, tok, QWEN3, ChatOptions(processor=scripted(tok, REPLY, "Fine.")))
    pieces = list(c.send("hi"))
    assert split(pieces) == ("The user says hi.\nGreet back.", "Hello!")
    assert isinstance(pieces[0], Thought) and not isinstance(pieces[-1], Thought)
    turn = c.last_turn
    assert (turn.reasoning, turn.text) == ("The user says hi.\nGreet back.", "Hello!")
    assert turn.stats.reasoning_tokens == len(tok.encode("\nThe user says hi.\nGreet back.\n", add_special=False))
    assert c.messages[-1] == Message("assistant", "Hello!", "The user says hi.\nGreet back.")
    # streamed or not, the same answer: the text of the pieces that are not reasoning is the turn's text
    assert split(c.send("and?")) == ("", "Fine.") and c.last_turn.text == "Fine."


def test_a_template_opening_the_reasoning_in_the_prompt_starts_the_reply_inside_it(thinker):
    model, tok = thinker
    opened = JinjaTemplate(QWEN3_LIKE_TEMPLATE.replace("assistant\\n' }}", "assistant\\n<think>\\n' }}"),
                           isolated=False)
    assert opened.render([Message("user", "hi")]).endswith("<think>\n")
    c = Conversation(model, tok, opened, ChatOptions(processor=scripted(tok, "Just greet.\n</think>\n\nHi!")))
    assert split(c.send("hi")) == ("Just greet.", "Hi!")


def test_the_next_prompt_renders_past_reasoning_as_the_template_says(thinker):
    model, tok = thinker
    own = JinjaTemplate(QWEN3_LIKE_TEMPLATE, isolated=False)
    c = Conversation(model, tok, own, ChatOptions(processor=scripted(tok, REPLY, "Fine.")))
    list(c.send("hi"))
    history = [Message("user", "hi"), c.messages[-1], Message("user", "and?")]
    # the template drops reasoning before the last user message; the content never carries it
    assert "Greet back" not in own.render(history)
    after_last_user = own.render([Message("user", "hi"), c.messages[-1]], add_generation_prompt=False)
    assert "<think>\nThe user says hi.\nGreet back.\n</think>\n\nHello!" in after_last_user
    list(c.send("and?"))
    assert tok.decode(c.history).count("Greet back") == 0  # the cache holds the template's render


def test_a_built_in_format_leaves_past_reasoning_out_of_the_next_prompt_too(thinker):
    model, tok = thinker
    c = Conversation(model, tok, QWEN3, ChatOptions(processor=scripted(tok, REPLY, "Fine.")))
    list(c.send("hi"))
    assert "Greet back" in tok.decode(c.history)  # the reply as written, reasoning and all
    list(c.send("and?"))
    # the second prompt is a fresh render of the chat: the first reply without its reasoning
    expected = QWEN3.render_messages([Message("user", "hi"), c.messages[1], Message("user", "and?")])
    assert tok.decode(c.history) == expected + "Fine." and "Greet back" not in expected
    assert c.last_turn.stats.reused_tokens > 0  # the chat up to the first reply stayed in the cache


def test_thinking_off_closes_the_reasoning_in_the_prompt(thinker):
    model, tok = thinker
    own = JinjaTemplate(QWEN3_LIKE_TEMPLATE, isolated=False)
    c = Conversation(model, tok, own, ChatOptions(think_off=True, processor=scripted(tok, "Hi!")))
    assert split(c.send("hi")) == ("", "Hi!")
    assert tok.decode(c.history).endswith("<think>\n\n</think>\n\nHi!")


def reasoning_script(tok, words=40):
    return "<think>\n" + " ".join(f"w{i}" for i in range(words)) + "\n</think>\n\nDone."


@pytest.mark.parametrize("budget", [0, 1, 5, 17])
@pytest.mark.parametrize("speculation", [False, True], ids=["plain", "speculative"])
def test_a_thinking_budget_closes_the_reasoning_at_exactly_n_tokens(thinker, budget, speculation):
    model, tok = thinker
    script = tok.encode(reasoning_script(tok), add_special=False)
    close = tok.token_id("</think>")
    c = Conversation(model, tok, QWEN3, ChatOptions(processor=Script(script), thinking_budget=budget,
                                                    max_tokens=80, speculation=speculation))
    reasoning, _ = split(c.send("think"))
    ids = c.last_turn.token_ids
    opener = tok.encode("<think>", add_special=False)
    assert ids[:len(opener)] == opener
    # N tokens of the model's reasoning, then the forced closing marker
    assert ids[len(opener):len(opener) + budget] == script[len(opener):len(opener) + budget]
    assert ids[len(opener) + budget] == close
    assert c.last_turn.stats.reasoning_tokens == budget
    assert reasoning == tok.decode(script[len(opener):len(opener) + budget]).strip()


def test_a_budget_closer_is_a_forced_span_drafts_take(thinker):
    model, tok = thinker
    budget = ThinkingBudget(THINK, tok, 2)
    budget.begin("<|im_start|>assistant\n<think>\n")
    assert budget.forced_tokens() == [] and budget.valid_prefix_len([1, 2, 3, 4]) == 2
    for t in tok.encode("ab", add_special=False):
        budget.commit(t)
    assert budget.forced_tokens() == [tok.token_id("</think>")]
    logits = np.zeros(tok.vocab_size, dtype=np.float32)
    budget.process(logits, [])
    assert np.isfinite(logits).sum() == 1 and budget.vet(5) == tok.token_id("</think>")


def test_speculative_turns_equal_plain_ones_with_reasoning(thinker):
    model, tok = thinker
    out = []
    for speculation in (False, True):
        c = Conversation(model, tok, QWEN3, ChatOptions(processor=scripted(tok, REPLY, REPLY), max_tokens=60,
                                                        speculation=speculation))
        out.append([split(c.send("hi")), split(c.send("again")), c.history])
    assert out[0] == out[1]


HARMONY_REPLY = ("<|channel|>analysis<|message|>Simple sum.<|end|>"
                 "<|start|>assistant<|channel|>final<|message|>It is 4.")


@pytest.fixture(scope="module")
def harmony(tmp_path_factory):
    from engine.models import load_model
    from tests.engine.chat.reasoning_model import write_harmony_model

    model = load_model(write_harmony_model(tmp_path_factory.mktemp("harmony") / "harmony.gguf"))
    return model, load_tokenizer(model.file.metadata)


def test_a_harmony_reply_goes_past_the_analysis_message_to_its_final_answer(harmony):
    model, tok = harmony
    convo = Conversation.for_model(model, ChatOptions(processor=Script(
        tok.encode(HARMONY_REPLY, add_special=False) + [tok.eos_id])))
    assert convo.template.reasoning is HARMONY
    assert split(convo.send("2+2?")) == ("Simple sum.", "It is 4.")
    assert convo.last_turn.finish_reason == "stop"


def test_a_harmony_budget_forces_the_end_of_analysis_and_the_final_channels_header(harmony):
    model, tok = harmony
    script = tok.encode("<|channel|>analysis<|message|>" + "x" * 80, add_special=False)
    convo = Conversation.for_model(model, ChatOptions(processor=Script(script), thinking_budget=4, max_tokens=60))
    reasoning, answer = split(convo.send("2+2?"))
    ids = convo.last_turn.token_ids
    opened = len(tok.encode("<|channel|>analysis<|message|>", add_special=False))
    closer = tok.encode(HARMONY.closer, add_special=False)
    assert reasoning == "xxxx" and ids[opened + 4:opened + 4 + len(closer)] == closer
    assert answer == "x" * (60 - opened - 4 - len(closer))  # the final channel: the script's text goes on


R1_LIKE = QWEN3_LIKE_TEMPLATE.replace("assistant\\n' }}", "assistant\\n<think>\\n' }}")


@pytest.mark.parametrize("speculation", [False, True], ids=["plain", "speculative"])
def test_a_response_format_holds_the_answer_after_the_reasoning(thinker, speculation):
    """The prompt opens the reasoning; a JSON format holds only what follows it (here the random model
    reasons until the budget closes its reasoning, then the grammar writes its answer)."""
    model, tok = thinker
    opened = JinjaTemplate(R1_LIKE, isolated=False)
    c = Conversation(model, tok, opened, ChatOptions(grammar=Grammar.json_object(), thinking_budget=3,
                                                     max_tokens=48, speculation=speculation))
    reasoning, answer = split(c.send("hi"))
    ids = c.last_turn.token_ids
    assert ids[3] == tok.token_id("</think>")  # three free tokens of reasoning, then the forced marker
    assert c.last_turn.finish_reason in ("stop", "length_closed")
    assert isinstance(json.loads(answer), dict) and c.last_turn.text == answer


def test_a_reply_that_may_open_its_reasoning_is_the_grammars_or_the_opener(thinker):
    model, tok = thinker
    opener = tok.token_id("<think>")
    answer_grammar = Conversation(model, tok, QWEN3, ChatOptions(grammar=Grammar.json_object(), max_tokens=48))
    processor = answer_grammar.sampler.processor
    processor.reset()
    processor.set_budget(48)
    processor.begin("<|im_start|>assistant\n")
    logits = np.zeros(tok.vocab_size, dtype=np.float32)
    processor.process(logits, [])
    allowed = set(np.flatnonzero(np.isfinite(logits)))
    assert opener in allowed and tok.token_id("{") in allowed and tok.token_id("x") not in allowed
    reasoning, answer = split(answer_grammar.send("hi"))
    assert isinstance(json.loads(answer), dict)


WEATHER = ToolSpec("get_weather", "Get the weather", {"type": "object", "properties": {"city": {"type": "string"}},
                                                       "required": ["city"]})


@pytest.mark.parametrize("answer, must_answer", [
    ({"grammar": Grammar.json_object()}, True),
    ({"tools": ToolUse((WEATHER,), "required")}, True),
    ({"tools": ToolUse((WEATHER,), "auto")}, False),
], ids=["json", "required_call", "auto_tools"])
def test_a_reply_that_must_answer_is_not_ended_inside_its_reasoning(thinker, answer, must_answer):
    """Inside the reasoning the prompt opened, the reply's end (its stop marker) is refused where the answer
    cannot be empty (a JSON document, a required call): by the mask, by vet, and in a draft's valid prefix.
    Where the answer may be nothing (tools offered, tool_choice auto), the reasoning may end the reply."""
    model, tok = thinker
    c = Conversation(model, tok, JinjaTemplate(R1_LIKE, isolated=False), ChatOptions(max_tokens=48, **answer))
    processor, end, word = c.sampler.processor, tok.token_id("<|im_end|>"), tok.token_id("x")
    processor.reset()
    processor.set_budget(48)
    processor.begin("<|im_start|>assistant\n<think>\n")
    logits = np.zeros(tok.vocab_size, dtype=np.float32)
    processor.process(logits, [])
    assert np.isfinite(logits[word])
    assert np.isfinite(logits[end]) != must_answer
    assert (processor.vet(end) is None) == must_answer
    assert processor.valid_prefix_len([word, end, word]) == (1 if must_answer else 3)
