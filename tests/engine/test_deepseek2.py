"""deepseek2 (latent attention, a dense leading layer, experts with a shared one) on the tiny random models of
tests/moe_models.py: its metadata read as llama.cpp reads it, the cache keeping one latent row per position,
a reopened chat bitwise the uninterrupted one and a chat over a cartridge bitwise the one over the real
prefill, and malformed files refused by name. Its forwards against llama.cpp's are
tests/engine/test_moe_oracle.py's; its row-wise contract (rows == one at a time, a batched step == each
alone, speculative == plain) test_moe.py's."""

import numpy as np
import pytest
from gguf.constants import GGUFValueType as V

from engine.errors import ConfigError, GGUFError, UnsupportedOnBackend
from engine.gguf.reader import open_gguf
from engine.kv import persist
from engine.models import deepseek2, load_model
from engine.models.experts import MoeArgs
from engine.models.feed_forward import GatedMlpArgs
from engine.models.latent_attention import LatentAttentionArgs
from kernels.backend import OP_LATENT_ATTENTION, Gating
from tests.backends import cpu_without
from tests.chat_equivalences import (
    assert_a_chat_over_a_cartridge_is_the_chat_over_the_real_prefill,
    assert_a_reopened_chat_continues_as_the_uninterrupted_one,
)
from tests.engine.chat.conftest import byte_level_chatml_tokenizer
from tests.moe_models import (
    DEEPSEEK2, DEEPSEEK2_SHAPE, DEEPSEEK2_VARIANTS, N_FF_EXP, TOKENS, assert_refused, write_deepseek2_model,
)
from tests.row_wise import assert_same_cache

LATENT_ROW = DEEPSEEK2_SHAPE["kv_lora_rank"] + DEEPSEEK2_SHAPE["rope"]
FINGERPRINT = bytes(range(32))


@pytest.fixture(scope="module", params=list(DEEPSEEK2_VARIANTS))
def model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("deepseek2") / f"{request.param}.gguf"
    write_deepseek2_model(path, request.param)
    return load_model(path)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """(model, tokenizer): the V3 layout with Q4_K experts, over the byte-level ChatML vocabulary it carries."""
    path = tmp_path_factory.mktemp("deepseek2-chat") / "m.gguf"
    write_deepseek2_model(path, "v3-q4_k")
    return load_model(path), byte_level_chatml_tokenizer()


@pytest.fixture(scope="module", params=["lite", "v3"])
def args(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("deepseek2-args") / "m.gguf"
    write_deepseek2_model(path, f"{request.param}-f32")
    with open_gguf(path) as file:
        return request.param, deepseek2.model_args(dict(file.metadata))


def test_the_first_layer_is_dense_and_the_others_experts_with_a_shared_one(args):
    layout, a = args
    assert [type(layer.feed_forward) for layer in a.layers] == [GatedMlpArgs, MoeArgs, MoeArgs]
    experts = a.layers[1].feed_forward
    assert experts.n_shared_ff == N_FF_EXP and experts.selection_bias
    expected = ((Gating.SOFTMAX, False, 1.0, 0, 0) if layout == "lite" else (Gating.SIGMOID, True, 2.5, 4, 2))
    assert (experts.gating, experts.normalize, experts.scale, experts.n_groups, experts.groups_used) == expected


def test_every_layer_attends_through_the_latent_with_deepseeks_yarn(args):
    layout, a = args
    s = DEEPSEEK2_SHAPE
    for layer in a.layers:
        m = layer.mixer
        assert isinstance(m, LatentAttentionArgs)
        assert (m.rank, m.nope, m.rope_dims, m.v_dim) == (s["kv_lora_rank"], s["nope"], s["rope"], s["v"])
        assert m.q_rank == (s["q_lora_rank"] if layout == "v3" else 0) and not m.rope_neox
        # DeepSeek-V2's YaRN: the magnitude's ratio cancels (mscale == mscale_all_dim = 0.707) ...
        assert m.rope_scaling.magnitude() == pytest.approx(1.0)
        # ... and the attention scale is (1 + 0.1 * 0.707 * ln 4)^2 / sqrt(key length)
        assert m.scale == pytest.approx((1 + 0.1 * 0.707 * np.log(4.0)) ** 2 / np.sqrt(s["nope"] + s["rope"]),
                                        rel=1e-5)


def test_the_cache_keeps_one_latent_row_per_position_once(model, tmp_path):
    """Not expanded keys and values (4 heads of 48 + 32 values), nor the row twice: 80 f16 values a layer."""
    cache = model.new_cache(16)
    assert cache.kv_heads == (1, 1, 1) and cache.head_dims == (LATENT_ROW,) * 3 and all(cache.value_is_key)
    assert cache.byte_size() == 3 * 16 * LATENT_ROW * 2
    model.forward(TOKENS[:9], cache)
    assert persist.bytes_per_token(cache) == 4 + 3 * LATENT_ROW * 2 + 4  # token, a row a layer, CRC
    path = tmp_path / "c.kv"
    persist.reset(path, cache, FINGERPRINT)
    persist.append_range(path, cache, TOKENS[:9], FINGERPRINT)
    assert path.stat().st_size == persist.header_size(cache) + 9 * persist.bytes_per_token(cache)
    loaded = model.new_cache(16)
    assert persist.load(path, loaded, FINGERPRINT).tokens == TOKENS[:9]
    assert_same_cache(loaded, cache)
    np.testing.assert_array_equal(model.forward(TOKENS[9:12], loaded), model.forward(TOKENS[9:12], cache))


def test_a_copied_prefix_carries_the_latent_rows(model):
    """What a server slot does with another slot's shared prefix: the rows copied, once each."""
    donor, copy = model.new_cache(16), model.new_cache(16)
    model.forward(TOKENS[:9], donor)
    copy.copy_prefix(donor, 6)
    assert copy.len == 6 and all(k is v for k, v in zip(copy.k, copy.v))
    for a, b in zip(copy.k, donor.k):
        np.testing.assert_array_equal(a[:6], b[:6])
    donor.truncate(6)
    np.testing.assert_array_equal(model.forward(TOKENS[6:12], copy), model.forward(TOKENS[6:12], donor))


def test_a_reopened_chat_continues_as_the_uninterrupted_one(chat_model, tmp_path):
    assert_a_reopened_chat_continues_as_the_uninterrupted_one(chat_model, tmp_path)


def test_a_chat_over_a_cartridge_is_the_chat_over_the_real_prefill(chat_model):
    assert_a_chat_over_a_cartridge_is_the_chat_over_the_real_prefill(chat_model)


def test_a_file_whose_metadata_says_older_without_its_attn_kv_b_names_the_tensor(tmp_path):
    assert_refused(write_deepseek2_model, tmp_path, GGUFError, "missing tensors 'blk.0.attn_kv_b.weight'",
                   metadata={f"{DEEPSEEK2}.attention.key_length_mla": (0, V.UINT32)})


def test_groups_that_do_not_split_the_experts_are_refused_by_name(tmp_path):
    assert_refused(write_deepseek2_model, tmp_path, ConfigError,
                   f"{DEEPSEEK2}.expert_group_count 3 must split the experts",
                   variant="v3-f32", metadata={f"{DEEPSEEK2}.expert_group_count": (3, V.UINT32)})


def test_an_unknown_gating_function_is_named(tmp_path):
    assert_refused(write_deepseek2_model, tmp_path, ConfigError, f"{DEEPSEEK2}.expert_gating_func is 3",
                   metadata={f"{DEEPSEEK2}.expert_gating_func": (3, V.UINT32)})


def test_a_missing_latent_tensor_is_named(tmp_path):
    assert_refused(write_deepseek2_model, tmp_path, GGUFError, "missing tensor 'blk.2.attn_k_b.weight'",
                   skip_tensors=("blk.2.attn_k_b.weight",))


def test_a_missing_shared_expert_is_named(tmp_path):
    assert_refused(write_deepseek2_model, tmp_path, GGUFError, "missing tensor 'blk.1.ffn_up_shexp.weight'",
                   skip_tensors=("blk.1.ffn_up_shexp.weight",))


def test_a_backend_without_latent_attention_refuses_the_model_by_name(tmp_path):
    path = tmp_path / "m.gguf"
    write_deepseek2_model(path)
    with pytest.raises(UnsupportedOnBackend, match="need the latent_attention op.*no-mla backend"):
        load_model(path, cpu_without(OP_LATENT_ATTENTION, "no-mla"))


def test_an_older_files_attn_kv_b_is_split_into_each_heads_absorbing_and_value_weights(tmp_path):
    """Each head's key rows of attn_kv_b, transposed (widened once), absorb its query; its value rows are read
    in place. (llama.cpp runs such a file as plain multi-head attention: test_moe_oracle.py compares them.)"""
    from kernels.common import gguf_weights
    from gguf.constants import GGMLQuantizationType as T

    path = tmp_path / "unsplit.gguf"
    write_deepseek2_model(path, "unsplit-f32", qtype=T.Q8_0)  # attn_kv_b quantized, as real files have it
    model = load_model(path)
    s, info = DEEPSEEK2_SHAPE, model.file.tensor("blk.1.attn_kv_b.weight")
    kv_b = gguf_weights.dequantize(info.ggml_type, model.file.raw(info))  # [heads * (nope + v), rank]
    latent = model.blocks[1].mixer.latent
    for h in range(4):
        first = h * (s["nope"] + s["v"])
        k_b = latent.k_b[h].raw.view(np.float32).reshape(s["kv_lora_rank"], s["nope"])
        np.testing.assert_array_equal(k_b, kv_b[first : first + s["nope"]].T)
        assert latent.v_b[h].qtype == T.Q8_0 and np.shares_memory(latent.v_b[h].raw, model.file.raw(info))
    assert model.new_cache(8).head_dims == (LATENT_ROW,) * 3  # the latent is cached, not expanded keys
