"""Gemma 4 (engine/models/gemma4.py) on the tiny random models of tests/gemma4_models.py: its layers as the file
describes them, the spec's equivalences bitwise (rows == one at a time, decode == rows past a prefill chunk,
speculative == plain, a reopened chat == the uninterrupted one) and hostile metadata refused by name. Its logits
against llama.cpp's: tests/engine/test_moe_oracle.py."""

from __future__ import annotations

import pytest
from gguf.constants import GGUFValueType as V

from engine.errors import ConfigError, UnsupportedOnBackend
from engine.gguf.reader import open_gguf
from engine.models import build_model, load_model
from engine.models.gemma4 import Gemma4Block
from engine.sampling import SamplerConfig
from engine.speculative import stream
from kernels.backend import OP_ATTENTION_SHARED, OP_SCALE
from tests.backends import cpu_without
from tests.chat_equivalences import assert_a_reopened_chat_continues_as_the_uninterrupted_one
from tests.engine.chat.conftest import byte_level_chatml_tokenizer
from tests.gemma4_models import GEMMA4, HEAD_FULL, HEAD_SWA, write_gemma4_model
from tests.moe_models import TOKENS, assert_refused
from tests.row_wise import (
    assert_batched_step_equals_each_alone, assert_decode_equals_rows_past_a_prefill_chunk,
    assert_rows_equal_one_at_a_time, assert_speculative_yields_the_plain_ids,
)


@pytest.fixture(scope="module", params=["e-f32", "e-q4_k", "moe-q4_k"])
def model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma4") / f"{request.param}.gguf"
    write_gemma4_model(path, request.param)
    return load_model(path)


def test_the_layers_are_as_the_file_describes_them(model):
    layers = [layer.mixer for layer in model.args.layers]
    assert all(isinstance(b, Gemma4Block) and b.spec() is None for b in model.blocks)
    sliding = [a.window > 0 for a in layers]
    assert [a.head_dim for a in layers] == [HEAD_SWA if s else HEAD_FULL for s in sliding]
    assert [a.rope_freqs for a in layers] == [not s for s in sliding]
    assert all(a.scale == 1.0 and a.value_norm for a in layers)
    cache = model.new_cache(8)
    if model.args.layer_inputs is not None:  # the "e" layout: the last two layers read layers 2 and 3's rows
        assert [a.kv_from for a in layers] == [-1, -1, -1, -1, 2, 3]
        assert model.args.memory_slots() == [0, 1, 2, 3, 2, 3] and cache.n_layers == 4
        assert all(b.per_layer is not None and b.out_scale is not None for b in model.blocks)
    else:  # the "moe" layout: experts in every layer, the full layer's V from its K product
        assert all(b.moe is not None and b.moe.experts.down_scale is not None for b in model.blocks)
        assert [b.mixer.value_from_key for b in model.blocks] == [False, False, False, True]
    assert model.args.logit_softcap == 30.0


def test_rows_equal_one_at_a_time(model):
    assert_rows_equal_one_at_a_time(model)


def test_decode_equals_rows_past_a_prefill_chunk(model):
    assert_decode_equals_rows_past_a_prefill_chunk(model)


def test_a_batched_decode_step_equals_each_conversation_alone(model):
    assert_batched_step_equals_each_alone(model, [TOKENS[:3], TOKENS[5:11], TOKENS[20:22]], [7, 100, 258])


@pytest.mark.parametrize("config", [SamplerConfig(), SamplerConfig(temperature=0.8, top_k=20, seed=3)],
                         ids=["greedy", "seeded"])
def test_speculative_decoding_yields_the_plain_ids(model, config, monkeypatch):
    assert_speculative_yields_the_plain_ids(model, TOKENS[:6] * 3, config, monkeypatch)


@pytest.fixture
def drafts_pay(monkeypatch):
    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: 1.0 for m in range(1, 18)})


@pytest.mark.parametrize("speculation", [False, True], ids=["plain", "speculative"])
def test_a_reopened_chat_continues_as_the_uninterrupted_one(model, tmp_path, speculation, drafts_pay):
    chat_model = (model, byte_level_chatml_tokenizer())
    assert_a_reopened_chat_continues_as_the_uninterrupted_one(chat_model, tmp_path, speculation=speculation)


@pytest.mark.parametrize("key, value, vtype, match", [
    ("attention.shared_kv_layers", 5, V.UINT32, "shared_kv_layers is 5"),
    ("attention.value_length_swa", 32, V.UINT32, "value_length_swa 32 differs"),
    ("expert_used_count", 9, V.UINT32, "expert_used_count is 9"),
])
def test_metadata_the_kernels_cannot_run_is_refused_by_name(tmp_path, key, value, vtype, match):
    assert_refused(write_gemma4_model, tmp_path, ConfigError, match, variant="moe-f32" if "expert" in key else "e-f32",
                   metadata={f"{GEMMA4}.{key}": (value, vtype)})


def test_a_file_without_its_sliding_window_pattern_is_refused(tmp_path):
    path = tmp_path / "m.gguf"
    write_gemma4_model(path, "e-f32")
    file = open_gguf(path)
    file.metadata.pop(f"{GEMMA4}.attention.sliding_window_pattern")
    with pytest.raises(ConfigError, match="sliding_window_pattern is missing"):
        build_model(file)
    file.close()


@pytest.mark.parametrize("op", [OP_ATTENTION_SHARED, OP_SCALE])
def test_a_backend_without_its_ops_refuses_the_model_by_name(tmp_path, op):
    path = tmp_path / "m.gguf"
    write_gemma4_model(path, "e-f32")
    with pytest.raises(UnsupportedOnBackend, match=op):
        load_model(path, cpu_without(op, "device"))
