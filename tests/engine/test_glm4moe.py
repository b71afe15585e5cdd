"""glm4moe (GLM-4.5, GLM-4.5-Air) read from its metadata as llama.cpp reads it: partial NeoX RoPE, biases, q/k
norms where the file has them, the experts' routing and the MTP layers appended to block_count left out of the
forward; malformed files refused by name; a reopened chat and a chat over a cartridge bitwise the uninterrupted
one and the one over the real prefill, speculating with the MTP layer or not (tests/engine/test_next_token.py
has the layer's drafts). Its forwards against llama.cpp's are tests/engine/test_moe_oracle.py's,
its row-wise contract test_moe.py's."""

import numpy as np
import pytest
from gguf.constants import GGUFValueType as V

from engine.errors import ConfigError
from engine.gguf.reader import open_gguf
from engine.models import glm4moe, load_model
from engine.models.experts import MoeArgs
from engine.models.feed_forward import GatedMlpArgs
from kernels.backend import Gating
from engine.speculative import stream
from tests.chat_equivalences import (
    assert_a_chat_over_a_cartridge_is_the_chat_over_the_real_prefill,
    assert_a_reopened_chat_continues_as_the_uninterrupted_one, chat, reply,
)
from tests.engine.chat.conftest import byte_level_chatml_tokenizer
from tests.moe_models import GLM4MOE, N_FF_EXP, TOKENS, assert_refused, write_glm4moe_model


@pytest.fixture(scope="module", params=["air-f32", "qk-norm-f32"])
def args(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("glm4moe") / "m.gguf"
    write_glm4moe_model(path, request.param)
    with open_gguf(path) as file:
        return glm4moe.model_args(dict(file.metadata))


def test_the_first_layer_is_dense_and_the_others_experts_with_a_shared_one(args):
    assert [type(layer.feed_forward) for layer in args.layers] == [GatedMlpArgs, MoeArgs, MoeArgs]
    experts = args.layers[1].feed_forward
    assert (experts.gating, experts.normalize, experts.n_shared_ff) == (Gating.SIGMOID, True, N_FF_EXP)
    assert experts.scale == pytest.approx(1.8)  # stored as a float32
    assert all(layer.ffn_norm == "post_attention_norm.weight" for layer in args.layers)


def test_attention_rotates_half_of_each_head_in_neox_pairs_with_biases(args):
    for layer in args.layers:
        a = layer.mixer
        assert (a.head_dim, a.rope_dims, a.rope_neox, a.qkv_bias, a.optional_extras) == (64, 32, True, True, True)


def test_q_k_norms_are_used_where_the_file_has_them(tmp_path):
    for variant, has_norms in (("air-f32", False), ("qk-norm-f32", True)):
        path = tmp_path / f"{variant}.gguf"
        write_glm4moe_model(path, variant)
        attention = load_model(path).blocks[0].mixer
        assert (attention.q_norm is not None, attention.k_norm is not None) == (has_norms, has_norms)


def test_the_mtp_layer_counted_in_block_count_is_left_out_of_the_forward(tmp_path):
    plain, with_mtp = tmp_path / "plain.gguf", tmp_path / "mtp.gguf"
    write_glm4moe_model(plain)
    # the same three layers, block_count 4 counting one next-token-prediction layer (a file without its
    # tensors, as llama.cpp's trunk-only load reads it)
    write_glm4moe_model(with_mtp, metadata={f"{GLM4MOE}.block_count": (4, V.UINT32),
                                            f"{GLM4MOE}.nextn_predict_layers": (1, V.UINT32)})
    a, b = load_model(plain), load_model(with_mtp)
    assert a.n_layers == b.n_layers == 3
    np.testing.assert_array_equal(a.forward_all(TOKENS[:8], a.new_cache(8)), b.forward_all(TOKENS[:8], b.new_cache(8)))


def _refused(tmp_path, match, **metadata):
    assert_refused(write_glm4moe_model, tmp_path, ConfigError, match,
                   metadata={f"{GLM4MOE}.{k}": v for k, v in metadata.items()})


def test_mtp_layers_that_leave_nothing_to_run_are_refused(tmp_path):
    _refused(tmp_path, "nextn_predict_layers \\(3\\) leaves none of the 3 layers", nextn_predict_layers=(3, V.UINT32))


def test_multi_axis_rope_is_refused_by_name(tmp_path):
    _refused(tmp_path, "rope.dimension_sections", **{"rope.dimension_sections": ([8, 8, 8, 8], V.ARRAY)})


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """(model, tokenizer): the Air layout with Q4_K experts and its next-token-prediction layer."""
    path = tmp_path_factory.mktemp("glm4moe-chat") / "m.gguf"
    write_glm4moe_model(path, "air-q4_k", next_token=True)
    return load_model(path), byte_level_chatml_tokenizer()


@pytest.fixture
def drafts_pay(monkeypatch):
    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: 1.0 for m in range(1, 18)})


def _drafted_by_the_layer(convo) -> int:
    return next(s.drafted for s in convo.draft_sources() if s.name == "next-token layer")


@pytest.mark.parametrize("speculation", [False, True], ids=["plain", "speculative"])
def test_a_reopened_chat_continues_as_the_uninterrupted_one(chat_model, tmp_path, speculation, drafts_pay):
    """Speculative: the next-token layer drafts over a cache whose rows came from the sidecar (no hidden states)."""
    reopened = assert_a_reopened_chat_continues_as_the_uninterrupted_one(chat_model, tmp_path, speculation=speculation)
    assert not speculation or _drafted_by_the_layer(reopened) > 0


@pytest.mark.parametrize("speculation", [False, True], ids=["plain", "speculative"])
def test_a_chat_over_a_cartridge_is_the_chat_over_the_real_prefill(chat_model, speculation, drafts_pay):
    served = assert_a_chat_over_a_cartridge_is_the_chat_over_the_real_prefill(chat_model, speculation=speculation)
    assert not speculation or _drafted_by_the_layer(served) > 0


def test_a_speculative_chats_next_token_layer_reads_its_first_prompt(chat_model, drafts_pay):
    convo = chat(chat_model, speculation=True)
    reply(convo, "hi")
    assert convo._next_token.positions_read.start == 0 and _drafted_by_the_layer(convo) > 0
