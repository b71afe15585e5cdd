"""qwen35 and qwen35moe (Qwen3.5's Gated DeltaNet hybrids) on the tiny random models of tests/hybrid_models.py
(llama.cpp's logits: tests/engine/test_moe_oracle.py): the row-wise contract over a recurrent state (rows == one at a time,
decode == rows past a prefill chunk, a batched step == each alone, speculative == plain, greedy and seeded, with
rejections), the memory's rewinds (a verify's rows, marks, a copied prefix), and the metadata it refuses."""

from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGUFValueType as V

from engine import generate
from engine.chat import Message
from engine.cartridge.cartridge import write_composed
from engine.errors import ConfigError, InvalidPrefix
from engine.kv.recurrent import MAX_MARKS, HybridCache
from engine.kv.sidecar_writer import WRITER
from engine.kv.state_persist import state_path
from engine.models import load_model
from engine.models.attention import Attention
from engine.models.delta_net import DeltaNet
from engine.models.experts import MoeFfn
from engine.sampling import Sampler, SamplerConfig
from engine.speculative import stream
from tests.chat_equivalences import CHATML, assert_a_reopened_chat_continues_as_the_uninterrupted_one, chat, reply
from tests.engine.chat.conftest import byte_level_chatml_tokenizer
from tests.engine.test_next_token import speculate_with_the_layer
from tests.hybrid_models import QWEN35, QWEN35MOE, write_qwen35_model, write_qwen35moe_model
from tests.moe_models import TOKENS, assert_refused
from tests.row_wise import (
    assert_batched_step_equals_each_alone, assert_decode_equals_rows_past_a_prefill_chunk,
    assert_rows_equal_one_at_a_time, assert_speculative_yields_the_plain_ids,
)


WRITERS = {QWEN35: write_qwen35_model, QWEN35MOE: write_qwen35moe_model}


@pytest.fixture(scope="module", params=[(a, v) for a in WRITERS for v in ("f32", "q4_k")], ids="-".join)
def model(request, tmp_path_factory):
    arch, variant = request.param
    path = tmp_path_factory.mktemp(arch) / f"{variant}.gguf"
    WRITERS[arch](path, variant)
    return load_model(path)


def assert_same_state(a: HybridCache, b: HybridCache) -> None:
    for layer in range(len(a.state_shapes)):
        for x, y in zip(a.state_store.read(layer), b.state_store.read(layer)):
            np.testing.assert_array_equal(x, y)


def test_deltanet_and_gated_attention_layers_alternate(model):
    assert [type(b.mixer) for b in model.blocks] == [DeltaNet, Attention] * 2
    moe = model.args.arch == QWEN35MOE
    assert all(isinstance(b.feed_forward, MoeFfn) == moe for b in model.blocks)
    assert all((b.feed_forward.shared_gate is not None) for b in model.blocks if moe)
    attention = model.args.layers[1].mixer
    assert (attention.output_gate, attention.qk_norm, attention.rope_dims, attention.rope_neox) == (True, True, 16, True)
    cache = model.new_cache(8)
    assert isinstance(cache, HybridCache) and cache.n_layers == 2  # KV rows for the attention layers only
    assert cache.state_shapes == (((3, 512), (8, 32, 32)),) * 2


def test_rows_equal_one_at_a_time_and_leave_the_same_state(model):
    assert_rows_equal_one_at_a_time(model)
    prompt, tokens = TOKENS[:4], TOKENS[4:20]
    one, rows = model.new_cache(32), model.new_cache(32)
    model.forward(prompt, one), model.forward(prompt, rows)
    for t in tokens:
        model.forward([t], one)
    model.forward_rows(tokens, rows)
    assert_same_state(one, rows)


def test_decode_equals_rows_past_a_prefill_chunk(model):
    assert_decode_equals_rows_past_a_prefill_chunk(model)


def test_a_batched_decode_step_equals_each_conversation_alone(model):
    assert_batched_step_equals_each_alone(model, [TOKENS[:3], TOKENS[5:11], TOKENS[20:22]], [7, 100, 258])


@pytest.mark.parametrize("config", [SamplerConfig(), SamplerConfig(temperature=0.8, top_k=20, seed=3)],
                         ids=["greedy", "seeded"])
def test_speculative_decoding_yields_the_plain_ids_with_rejections(model, config, monkeypatch):
    stats = assert_speculative_yields_the_plain_ids(model, TOKENS[:6] * 3, config, monkeypatch)
    # rejected rows were rolled back to a verify row's state (the Q4_K model's greedy reply repeats itself:
    # its few drafts are all accepted)
    assert stats.rejected_steps > 0 or (config.temperature == 0 and stats.accepted == stats.drafted)


def test_a_verify_rolls_back_to_any_of_its_rows_as_one_at_a_time_leaves_it(model):
    prompt, tokens = TOKENS[:5], TOKENS[5:11]
    for keep in range(1, len(tokens) + 1):
        one, verified = model.new_cache(32), model.new_cache(32)
        model.forward(prompt, one), model.forward(prompt, verified)
        for t in tokens[:keep]:
            model.forward([t], one)
        model.forward_rows(tokens, verified)
        assert verified.can_truncate(len(prompt) + keep)
        verified.truncate(len(prompt) + keep)
        assert_same_state(one, verified)
        np.testing.assert_array_equal(model.forward([3], verified), model.forward([3], one))


def test_a_state_rewinds_only_to_marks_keeping_the_newest(model):
    cache = model.new_cache(64)
    model.forward(TOKENS[:4], cache)
    assert not cache.can_truncate(2) and cache.truncation_point(3) == 0
    marks = []
    for i in range(MAX_MARKS + 2):
        model.forward([TOKENS[4 + i]], cache)
        cache.mark()
        marks.append(cache.len)
    assert cache.marks() == marks[-MAX_MARKS:]
    assert cache.truncation_point(marks[-1] - 1) == marks[-2]
    expected = model.new_cache(64)
    model.forward(TOKENS[:4], expected)
    for t in TOKENS[4 : marks[-3] - 0]:
        model.forward([t], expected)
    cache.truncate(marks[-3])
    assert cache.marks() == marks[-MAX_MARKS:-2]
    assert_same_state(expected, cache)
    with pytest.raises(ValueError, match="cannot be cut"):
        cache.truncate(marks[-3] - 1 if marks[-3] - 1 not in marks else 1)


def test_a_copied_prefix_continues_as_its_donor(model):
    donor = model.new_cache(32)
    model.forward(TOKENS[:6], donor)
    donor.mark()
    model.forward(TOKENS[6:10], donor)
    copy = model.new_cache(32)
    copy.copy_prefix(donor, 6)
    donor.truncate(6)
    assert_same_state(donor, copy)
    np.testing.assert_array_equal(model.forward([9], copy), model.forward([9], donor))


def test_a_hybrid_memory_is_saved_to_sidecars_and_refuses_composed_cartridges_by_name(model):
    cache = model.new_cache(8)
    assert cache.persistable and not cache.composable
    with pytest.raises(InvalidPrefix, match="recurrent state, which cannot be composed from 2 documents"):
        write_composed([object(), object()], cache)


@pytest.mark.parametrize("key, value, vtype, match", [
    ("ssm.inner_size", 100, V.UINT32, "ssm.inner_size 100 must be"),
    ("ssm.group_count", 3, V.UINT32, "ssm.group_count 3 must divide"),
    ("rope.dimension_sections", [2, 2, 2, 2], V.ARRAY, "fourth position axis"),
])
def test_metadata_the_kernels_cannot_run_is_refused_by_name(tmp_path, key, value, vtype, match):
    metadata = {f"{QWEN35}.{key}": (value, vtype)}
    assert_refused(write_qwen35_model, tmp_path, ConfigError, match, metadata=metadata)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen35-chat") / "m.gguf"
    write_qwen35_model(path, "f32")
    return load_model(path), byte_level_chatml_tokenizer()


@pytest.mark.parametrize("edit", ["the second message", "the first message", "nothing: a regenerated reply"])
def test_a_rerendered_history_rewinds_to_the_last_mark_before_it_differs(chat_model, edit):
    """A resent history keeps the chat's state up to its last mark (a turn's end, a prompt but its last token)
    at or before where the render differs, reads the rest, and replies as a fresh chat does."""
    model, tok = chat_model
    convo = chat(chat_model)
    first = reply(convo, "hi there")
    reply(convo, "tell me more")
    marks = convo.cache.marks()
    asked = {"the second message": ["hi there", "tell me less"], "the first message": ["hi you", "tell me more"],
             "nothing: a regenerated reply": ["hi there", "tell me more"]}[edit]
    rendered = CHATML.render_messages([Message("user", asked[0]), Message("assistant", first),
                                       Message("user", asked[1])])
    ids = tok.encode(rendered)
    common = next((i for i, (a, b) in enumerate(zip(ids, convo.history)) if a != b), len(ids))
    expected = max((m for m in marks if m <= min(common, len(ids) - 1)), default=0)
    assert (expected > 0) == (edit != "the first message")
    again = "".join(convo.send_rendered(rendered, reuse=True))
    assert convo.last_turn.stats.reused_tokens == expected
    fresh = chat(chat_model)
    assert "".join(fresh.send_rendered(rendered)) == again
    assert fresh.history == convo.history


@pytest.fixture
def drafts_pay(monkeypatch):
    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: 1.0 for m in range(1, 18)})


@pytest.mark.parametrize("speculation", [False, True], ids=["plain", "speculative"])
def test_a_reopened_chat_continues_as_the_uninterrupted_one(chat_model, tmp_path, speculation, drafts_pay):
    """(its KV rows and its state, bitwise: tests/row_wise.py's assert_same_cache)"""
    assert_a_reopened_chat_continues_as_the_uninterrupted_one(chat_model, tmp_path, speculation=speculation)


def _saved_chat(chat_model, path):
    convo = chat(chat_model)
    convo.enable_persistence(path)
    for user in ("hi", "more"):
        reply(convo, user)
    WRITER.flush()
    return convo


@pytest.mark.parametrize("damage", ["a flipped byte", "a torn file", "another model's", "no checkpoint"])
def test_a_damaged_or_missing_checkpoint_is_never_resumed(chat_model, tmp_path, damage):
    path = tmp_path / "chat.kv"
    saved = _saved_chat(chat_model, path)
    state = Path(state_path(path))
    data = bytearray(state.read_bytes())
    if damage == "a flipped byte":
        data[len(data) // 2] ^= 1
    elif damage == "a torn file":
        data = data[: len(data) - 100]
    elif damage == "another model's":
        data[8] ^= 1  # the fingerprint
    if damage == "no checkpoint":
        state.unlink()
    else:
        state.write_bytes(bytes(data))
    reopened = chat(chat_model)
    assert reopened.enable_persistence(path) == 0  # the chat is read again (its messages re-rendered)
    assert reopened.cache.len == 0 and reopened.history == [] and saved.cache.len > 0


def test_a_checkpoint_of_another_history_is_not_resumed_and_records_past_one_are_read_again(chat_model, tmp_path):
    path = tmp_path / "chat.kv"
    _saved_chat(chat_model, path)
    checkpoint = Path(state_path(path)).read_bytes()
    path.unlink()
    edited = chat(chat_model)  # the file rewritten with another history (an edit), its checkpoint the old one
    edited.enable_persistence(path)
    for user in ("hello", "more"):
        reply(edited, user)
    WRITER.flush()
    Path(state_path(path)).write_bytes(checkpoint)
    assert chat(chat_model).enable_persistence(path) == 0
    # the KV records reach past the newest checkpoint (a kill between the two writes): resumed at the checkpoint
    path2 = tmp_path / "ahead.kv"
    ahead = _saved_chat(chat_model, path2)
    first_turn = Path(state_path(path2)).read_bytes()  # overwritten below by the second turn's
    reply(ahead, "third")
    WRITER.flush()
    Path(state_path(path2)).write_bytes(first_turn)
    reopened = chat(chat_model)
    resumed = reopened.enable_persistence(path2)
    assert 0 < resumed < ahead.cache.len and reopened.history == ahead.history[:resumed]
    assert reply(reopened, "third") == ahead.last_turn.text  # the turn the checkpoint lacks, taken again
    assert reopened.history == ahead.history
    assert reply(reopened, "fourth") == reply(ahead, "fourth")
    assert reopened.last_turn.token_ids == ahead.last_turn.token_ids


def test_a_reopened_chat_whose_last_reply_renders_otherwise_reads_only_that_reply_again(chat_model, tmp_path):
    """The checkpoint file keeps the turn's prompt too: a resent history that differs inside the last reply (its
    text tokenizing otherwise than it was sampled) rewinds there, not to the start."""
    model, tok = chat_model
    path = tmp_path / "chat.kv"
    saved = _saved_chat(chat_model, path)
    reopened = chat(chat_model)
    assert reopened.enable_persistence(path) == saved.cache.len
    prompt_mark, end = reopened.cache.marks()
    assert 0 < prompt_mark < end - 2 and end == saved.cache.len
    otherwise = reopened.history[: end - 2] + tok.encode("!!", add_special=False)  # the reply's last two tokens
    "".join(reopened.send_tokens(otherwise + tok.encode("<|im_end|>\n", add_special=False), reuse=True))
    assert reopened.last_turn.stats.reused_tokens == prompt_mark


@pytest.fixture(scope="module")
def mtp_chat_model(tmp_path_factory):
    """(model, tokenizer): qwen35moe with Q4_K experts and its next-token-prediction (MTP) layer."""
    path = tmp_path_factory.mktemp("qwen35moe-mtp") / "m.gguf"
    write_qwen35moe_model(path, "q4_k", next_token=True)
    return load_model(path), byte_level_chatml_tokenizer()


def test_the_mtp_layer_is_gated_attention_with_experts_and_the_models_output_norm(mtp_chat_model):
    model, _ = mtp_chat_model
    layer = model.next_token
    assert isinstance(layer.block.mixer, Attention) and layer.block.mixer.args.output_gate
    assert isinstance(layer.block.feed_forward, MoeFfn)
    assert layer.head_norm is model.norm  # the file has no shared_head_norm


@pytest.mark.parametrize("config", [SamplerConfig(), SamplerConfig(temperature=0.8, top_k=20, seed=3)],
                         ids=["greedy", "seeded"])
def test_drafts_of_the_mtp_layer_yield_the_plain_ids(mtp_chat_model, config):
    model, _ = mtp_chat_model
    plain = list(generate.sample(model, TOKENS[:12], 30, Sampler(config)))
    ids, stats = speculate_with_the_layer(model, TOKENS[:12], 30, config)
    assert ids == plain
    assert stats.spec_steps > 0 and stats.drafted > stats.accepted  # rejected drafts rolled the state back


def test_a_reopened_chat_speculating_with_the_mtp_layer_continues_as_the_uninterrupted_one(mtp_chat_model, tmp_path,
                                                                                           drafts_pay):
    reopened = assert_a_reopened_chat_continues_as_the_uninterrupted_one(mtp_chat_model, tmp_path, speculation=True)
    assert next(s.drafted for s in reopened.draft_sources() if s.name == "next-token layer") > 0
