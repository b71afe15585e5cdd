"""Tool rounds on SmolLM2 with a fake toolbox (calls run once approved, their results go back, the model
replies again, within the round limit), the constraint's opener handling where the opener is several tokens,
and speculative tool rounds that commit the same tokens as plain ones."""

import dataclasses

import numpy as np
import pytest

from engine.chat import ChatOptions, Conversation
from engine.chat.tool_constraint import ToolCallConstraint
from engine.chat.tool_format import HERMES
from engine.chat.tool_rounds import DECLINED, ToolRan, send_with_tools
from engine.chat.tool_use import ToolUse
from engine.sampling import CHAT_DEFAULTS, SamplerConfig
from engine.speculative import stream
from engine.tools import ToolCall, ToolResult, ToolSpec

WEATHER = ToolSpec("get_weather", "Get the current weather in a city",
                   {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                    "required": ["city"], "additionalProperties": False})
QUESTION = "What is the weather in Paris right now?"


class FakeToolbox:
    def __init__(self, answer: str = '{"temperature": 18, "sky": "cloudy"}'):
        self.answer, self.ran = answer, []

    def specs(self):
        return [WEATHER]

    def run(self, call: ToolCall) -> ToolResult:
        self.ran.append(call)
        return ToolResult(call.id, self.answer)


def chat(real_model, name="smollm2-135m-instruct", choice="required", **options):
    model, tokenizer = real_model(name)
    options = {"capacity": 1024, "max_tokens": 60, "tools": ToolUse((WEATHER,), choice)} | options
    return Conversation.for_model(model, ChatOptions(**options), tokenizer=tokenizer)


def test_approved_calls_run_and_their_results_go_back_to_the_model(real_model):
    convo, toolbox = chat(real_model), FakeToolbox()
    events = list(send_with_tools(convo, QUESTION, toolbox, max_rounds=3))
    ran = [e for e in events if isinstance(e, ToolRan)]
    assert ran and [e.call for e in ran] == toolbox.ran
    assert all(c.name == "get_weather" and c.arguments["city"] for c in toolbox.ran)
    roles = [m.role for m in convo.messages]
    assert roles[:4] == ["user", "assistant", "tool", "assistant"] and roles[-1] == "assistant"
    first = convo.messages[1]
    assert first.tool_calls == tuple(toolbox.ran[:len(first.tool_calls)])
    assert convo.messages[2].tool_call_id == first.tool_calls[0].id and convo.messages[2].content == toolbox.answer
    prompt = convo.tokenizer.decode(convo.history)
    assert f"<tool_response>\n{toolbox.answer}\n</tool_response>" in prompt  # the result was read by the model
    assert convo.options.tools.choice == "required"  # forced for the first round only, then restored


def test_a_declined_call_is_answered_with_an_error_and_not_run(real_model):
    convo, toolbox = chat(real_model), FakeToolbox()
    events = list(send_with_tools(convo, QUESTION, toolbox, approve=lambda call: False, max_rounds=2))
    declined = [e for e in events if isinstance(e, ToolRan)]
    assert declined and all(e.result.is_error and e.result.content == DECLINED for e in declined)
    assert toolbox.ran == []
    assert convo.messages[2].role == "tool" and convo.messages[2].content == DECLINED


def test_the_rounds_end_at_their_limit(real_model):
    convo, toolbox = chat(real_model), FakeToolbox()
    events = list(send_with_tools(convo, QUESTION, toolbox, max_rounds=1))
    assert not any(isinstance(e, ToolRan) for e in events) and toolbox.ran == []
    assert convo.last_turn.tool_calls and [m.role for m in convo.messages] == ["user", "assistant"]


def test_tool_results_must_answer_the_last_calls(real_model):
    convo = chat(real_model)
    with pytest.raises(ValueError, match="made none"):
        convo.send_tool_results([])


def test_a_several_token_opener_starts_the_call_on_a_token_boundary(real_model):
    _, tokenizer = real_model("smollm2-135m-instruct")
    assert tokenizer.token_id("<tool_call>") is None  # SmolLM2 spells it in pieces
    constraint = ToolCallConstraint(HERMES, ToolUse((WEATHER,)), tokenizer, tokenizer.eos_id)
    constraint.reset()
    for token in tokenizer.encode("Sure. <tool_call", add_special=False):
        constraint.commit(token)
    assert not constraint.in_call
    logits = np.zeros(tokenizer.vocab_size, dtype=np.float32)
    constraint.process(logits, [])
    runs_on = [i for i in range(tokenizer.vocab_size) if tokenizer.token_bytes(i).startswith(b">")
               and len(tokenizer.token_bytes(i)) > 1]
    assert runs_on and np.all(np.isneginf(logits[runs_on]))  # `>` plus more would hide the call's start
    closer = tokenizer.encode(">", add_special=False)
    assert logits[closer[0]] == 0.0
    constraint.commit(closer[0])
    assert constraint.in_call
    forced = tokenizer.decode(constraint.forced_tokens())
    assert forced.startswith('\n{"name": "get_weather", "arguments": ')  # one tool: its name is forced


@pytest.fixture
def free_verify(monkeypatch):
    """Verifies priced like plain steps, so every step drafts what it can (as the speculation tests do)."""
    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: 1.0 for m in range(1, 18)})


@pytest.mark.parametrize("name, sampler", [
    ("smollm2-135m-instruct", SamplerConfig()),
    ("smollm2-135m-instruct", dataclasses.replace(CHAT_DEFAULTS, seed=11)),
    ("qwen2.5-coder-0.5b-instruct", SamplerConfig()),
], ids=["smollm2-greedy", "smollm2-seeded", "qwen-greedy"])
def test_speculative_tool_rounds_commit_the_same_tokens_as_plain_ones(real_model, free_verify, name, sampler):
    plain, spec = (chat(real_model, name, sampler=sampler, speculation=s, max_tokens=48) for s in (False, True))
    spec.model.rows_ready(spec.cache, wait=True)  # speculation runs from the first reply
    replies = []
    for convo in (plain, spec):
        pieces = [p for p in send_with_tools(convo, QUESTION, FakeToolbox(), max_rounds=2) if isinstance(p, str)]
        replies.append(("".join(pieces), [(c.name, c.arguments) for m in convo.messages for c in m.tool_calls]))
    assert replies[1] == replies[0]
    assert spec.history == plain.history and plain.last_turn.stats.spec is None
    assert spec.last_turn.stats.spec is not None and spec.last_turn.stats.spec.spec_steps > 0
    np.testing.assert_array_equal(spec.last_turn.token_ids, plain.last_turn.token_ids)
