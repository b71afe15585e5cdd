"""Speculative turns equal plain turns on a tiny random model: the text, the token ids, the finish reason,
the history and the KV cache rows after every turn, for greedy and seeded sampled decoding, with stop
sequences, masking processors, token and context budgets, LCP reuse and reopened conversations; and on
real models, short replies on SmolLM2 and Qwen2.5-Coder."""

import numpy as np
import pytest

from engine.chat import (ChatOptions, Conversation, JinjaTemplate, Message, Template, Format, send_batch,
                         template_for_model)
from engine.kv.sidecar_writer import WRITER
from engine.sampling import LogitProcessor, SamplerConfig
from tests.engine.chat.conftest import Script
from engine.speculative import stream

CHATML = Template(Format.CHATML)
SAMPLED = SamplerConfig(temperature=0.9, top_k=40, top_p=0.9, min_p=0.02, repeat_penalty=1.1,
                        freq_penalty=0.1, presence_penalty=0.1, seed=7)


@pytest.fixture(autouse=True)
def free_verify(monkeypatch):
    """Verifies priced like plain steps, so the gate never turns speculation off and every step drafts
    what it can (the gate's own test prices them otherwise)."""
    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: 1.0 for m in range(1, 18)})


class BanOddIds(LogitProcessor):
    def process(self, logits, history):
        logits[1::2] = -np.inf

    def commit(self, token):
        assert token % 2 == 0


def ids(tok, text):
    return tok.encode(text, add_special=False)


def pair(model_and_tokenizer, template=CHATML, processor=lambda: None, **options):
    """A plain and a speculative conversation with the same options (each its own processor); template
    None: the model's own."""
    model, tok = model_and_tokenizer
    template = template or template_for_model(model.file.metadata, tok)
    return [Conversation(model, tok, template, ChatOptions(processor=processor(), speculation=spec, **options))
            for spec in (False, True)]


def assert_same_state(plain, spec):
    assert spec.history == plain.history
    p, s = plain.last_turn, spec.last_turn
    assert (s.text, s.token_ids, s.finish_reason, s.fired_stop) == (p.text, p.token_ids, p.finish_reason, p.fired_stop)
    assert s.stats.generated_tokens == p.stats.generated_tokens
    assert p.stats.spec is None and s.stats.spec is not None
    assert spec._speculation.index.conversation.tokens == spec.history  # the index holds what the cache means
    assert spec.cache.len == plain.cache.len
    for layer in range(plain.cache.n_layers):
        np.testing.assert_array_equal(spec.cache.k[layer][: spec.cache.len], plain.cache.k[layer][: plain.cache.len])
        np.testing.assert_array_equal(spec.cache.v[layer][: spec.cache.len], plain.cache.v[layer][: plain.cache.len])


def turns(convos, users, send=lambda c, u: c.send(u)):
    """Send each user message to both conversations; check them equal after every turn. Spec stats."""
    plain, spec = convos
    stats = []
    for user in users:
        assert "".join(send(spec, user)) == "".join(send(plain, user))
        assert_same_state(plain, spec)
        stats.append(spec.last_turn.stats.spec)
    return stats


ECHO = "abc abc abc abc abc abc abc abc"


@pytest.mark.parametrize("sampler", [SamplerConfig(), SAMPLED], ids=["greedy", "sampled"])
def test_three_turns_with_a_persistent_sampler_equal_plain_turns(tiny_chat, sampler):
    stats = turns(pair(tiny_chat, sampler=sampler, max_tokens=40), ["hi " + ECHO, ECHO + " again", "and " + ECHO])
    assert sum(s.spec_steps for s in stats) > 0  # drafts were verified: not every step was a plain one


def test_copied_text_is_drafted_and_accepted(tiny_chat):
    _, tok = tiny_chat
    text = "the quick brown fox jumps over the lazy dog"
    convos = pair(tiny_chat, processor=lambda: Script(ids(tok, text) + [tok.token_id("<|im_end|>")]), max_tokens=80)
    [stats] = turns(convos, [f"repeat: {text}"])
    assert convos[1].last_turn.finish_reason == "stop"
    assert stats.accepted > len(ids(tok, text)) // 2 and stats.steps < len(ids(tok, text))


def test_a_stop_sequence_inside_a_draft_is_neither_streamed_nor_committed(tiny_chat):
    _, tok = tiny_chat
    text = "Hello there, Hello there, Hello there"
    convos = pair(tiny_chat, processor=lambda: Script(ids(tok, text)), stop_sequences=("xyz", "there, Hello t"))
    [stats] = turns(convos, [text])
    assert convos[1].last_turn.text == "Hello there, Hello "
    assert convos[1].last_turn.finish_reason == "stop_sequence" and convos[1].last_turn.fired_stop == 1
    assert stats.accepted > 0
    turns(convos, ["more"])  # and the next turn goes on from the same state


def test_a_masking_processor_composes(tiny_chat):
    turns(pair(tiny_chat, processor=BanOddIds, sampler=SAMPLED, max_tokens=30), ["hi " + ECHO, ECHO])


@pytest.mark.parametrize("max_tokens", [1, 2, 5])
def test_token_budgets_end_mid_draft_like_plain_turns(tiny_chat, max_tokens):
    _, tok = tiny_chat
    convos = pair(tiny_chat, processor=lambda: Script(ids(tok, ECHO), ids(tok, ECHO)), max_tokens=max_tokens)
    turns(convos, [ECHO, ECHO])
    assert convos[1].last_turn.finish_reason == "length"
    assert convos[1].cache.len == len(convos[1].history) - 1  # the last token is left to the next prefill


def test_a_full_context_ends_mid_draft_like_a_plain_turn(tiny_chat):
    _, tok = tiny_chat
    prompt = len(tok.encode(CHATML.render_turn(ECHO)))
    convos = pair(tiny_chat, processor=lambda: Script(ids(tok, ECHO)), capacity=prompt + 6, max_tokens=50)
    turns(convos, [ECHO])
    assert convos[1].last_turn.finish_reason == "context" and convos[1].cache.len == convos[1].cache.capacity


def test_reused_and_edited_renders_rebuild_the_index(tiny_chat):
    source = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    convos = pair(tiny_chat, template=JinjaTemplate(source), max_tokens=24, sampler=SAMPLED)
    turns(convos, ["hi " + ECHO, "more " + ECHO])
    edited = CHATML.render_messages([Message("user", "hi " + ECHO + " edited")])  # rewinds into turn one
    turns(convos, [edited], send=lambda c, text: c.send_rendered(text, reuse=True))
    assert convos[1].last_turn.stats.reused_tokens < len(convos[1].tokenizer.encode(edited))


def test_a_reopened_conversation_drafts_from_its_whole_history(tiny_chat, tmp_path):
    model, tok = tiny_chat
    text = "a stored reply that the next turn repeats word for word"
    end = tok.token_id("<|im_end|>")
    first = Conversation(model, tok, CHATML, ChatOptions(processor=Script(ids(tok, text) + [end])))
    first.enable_persistence(tmp_path / "chat.fkv")
    "".join(first.send("say something"))
    WRITER.flush()
    (tmp_path / "copy.fkv").write_bytes((tmp_path / "chat.fkv").read_bytes())

    convos = []
    for spec, path in ((False, "chat.fkv"), (True, "copy.fkv")):
        c = Conversation(model, tok, CHATML, ChatOptions(processor=Script(ids(tok, text) + [end]), speculation=spec))
        assert c.enable_persistence(tmp_path / path) > 0  # warm: nothing of the first turn is prefilled again
        convos.append(c)
    [stats] = turns(convos, ["again"])
    assert stats.accepted >= len(ids(tok, text)) // 2  # drafted from the first turn, which this process never saw

    warm = [Conversation(model, tok, CHATML, ChatOptions(speculation=spec, sampler=SAMPLED, max_tokens=20),
                         warm=c.take_cache()) for spec, c in zip((False, True), convos)]
    turns(warm, ["once more"])


def test_the_cost_gate_decides_when_never_what(tiny_chat, monkeypatch):
    # verifies over m rows priced at m plain steps, and a coin-flip text whose drafts are often wrong:
    # speculation does not pay, so the gate turns it off for stretches; the output stays the plain one
    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: float(m) for m in range(1, 18)})
    _, tok = tiny_chat
    coin_flips = "".join(np.random.default_rng(0).choice(list("ab"), 160))
    convos = pair(tiny_chat, processor=lambda: Script(ids(tok, coin_flips)), max_tokens=160)
    [stats] = turns(convos, [coin_flips[:40]])
    assert stats.disabled_steps > 0 and stats.spec_steps > 0


def test_lockstep_batches_stay_plain_with_speculation_on(tiny_chat):
    plain, spec = pair(tiny_chat, max_tokens=6)
    [result] = send_batch([spec], ["hi"])
    "".join(plain.send("hi"))
    assert result.token_ids == plain.last_turn.token_ids and result.stats.spec is None


# --- real models: short replies that invite copying from the prompt and from earlier turns

PASSAGE = ("The lighthouse at Harrow Point was built in 1871 from granite cut on the island. Its lamp burned "
           "colza oil until 1902, when the keepers changed it for paraffin, and its light could be seen for "
           "eighteen miles on a clear night.")


def test_smollm2_greedy_three_turns_equal_plain(real_model):
    convos = pair(real_model("smollm2-135m-instruct"), template=None, max_tokens=48)
    stats = turns(convos, [f"Repeat this text exactly: {PASSAGE}", "Now repeat the first sentence again.",
                           "Say it once more, word for word."])
    assert sum(s.accepted for s in stats) > 0


def test_smollm2_sampled_with_penalties_and_a_stop_sequence_equal_plain(real_model):
    sampler = SamplerConfig(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1, seed=42)
    convos = pair(real_model("smollm2-135m-instruct"), template=None, max_tokens=48, sampler=sampler,
                  stop_sequences=("eighteen",))
    turns(convos, [f"Copy this text: {PASSAGE}", "Copy it again, please."])


def test_qwen_coder_greedy_equal_plain(real_model):
    code = "def area(width, height):\n    return width * height\n\n\nprint(area(3, 4))\n"
    convos = pair(real_model("qwen2.5-coder-0.5b-instruct"), template=None, max_tokens=48)
    [stats] = turns(convos, [f"Rename `area` to `surface` in this code and return all of it:\n```python\n{code}```"])
    assert stats.accepted > 0


# --- constrained replies (spec 13.9.6): the grammar-aware source drafts, the output stays the plain one

GRAMMAR_REPLY = r"(ab |abc |hi ){1,4}(end|stop)!"


def constrained(pattern=GRAMMAR_REPLY):
    from engine.sampling.grammar import Grammar
    return Grammar("regex", pattern)


@pytest.mark.parametrize("sampler", [SamplerConfig(), SAMPLED], ids=["greedy", "sampled"])
def test_constrained_turns_equal_plain_turns(tiny_chat, sampler, monkeypatch):
    from engine.speculative.constrained import ConstrainedSource

    # the prompts spell replies the grammar allows, so the cascade drafts past the grammar's end too
    end = tiny_chat[1].token_id("<|im_end|>")
    drafts = []
    suggest = ConstrainedSource.suggest

    def recorded(self, context, budget):
        drafts.append(suggest(self, context, budget))
        return drafts[-1]

    monkeypatch.setattr(ConstrainedSource, "suggest", recorded)
    stats = turns(pair(tiny_chat, sampler=sampler, max_tokens=40, grammar=constrained()),
                  ["ab ab abc end! ab hi", "hi hi abc stop!", "abc abc abc abc stop! and more"])
    assert sum(s.spec_steps for s in stats) > 0
    # some draft ran into the grammar's end: cut after the stop marker (which the turn boundary drops)
    assert any(len(d) > 1 and d[-1] == end for d in drafts)


def test_a_forced_reply_drafts_itself(tiny_chat):
    # every token is forced: the prompt holds nothing to copy, yet the reply verifies in a few steps
    convos = pair(tiny_chat, max_tokens=40, grammar=constrained("hello world, hello world"))
    [stats] = turns(convos, ["xyz"])
    assert convos[1].last_turn.text == "hello world, hello world" and convos[1].last_turn.finish_reason == "stop"
    assert stats.steps <= 3 and stats.accepted == stats.drafted > 0


def test_a_stop_sequence_inside_a_constrained_draft_ends_the_turn_like_plain(tiny_chat):
    convos = pair(tiny_chat, max_tokens=40, sampler=SAMPLED, grammar=constrained("hello world, hello world"),
                  stop_sequences=("d, h",))
    turns(convos, ["xyz", "again"])
    assert convos[1].last_turn.finish_reason == "stop_sequence" and convos[1].last_turn.text == "hello world, "


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
def test_real_constrained_replies_equal_plain_greedy_and_sampled(real_model, name):
    import json
    from pathlib import Path

    from engine.sampling.grammar import Grammar

    suite = {c["name"]: c for c in json.loads(
        (Path(__file__).parents[2] / "data" / "grammar" / "json_schemas.json").read_text())}
    accepted = 0
    for case, sampler in ((suite["person"], SamplerConfig()), (suite["enum_color"], SAMPLED)):
        grammar = Grammar("json_schema", json.dumps(case["schema"]))
        convos = pair(real_model(name), template=None, max_tokens=40, sampler=sampler, grammar=grammar)
        # the second reply has the first one's structure to copy: drafts the grammar cuts where they stray
        stats = turns(convos, [case["prompt"], "Another one, please."])
        assert convos[1].last_turn.finish_reason == "stop" and json.loads(convos[1].last_turn.text)
        accepted += stats[1].accepted
    assert accepted > 0
