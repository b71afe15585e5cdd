"""gpt-oss read from its metadata as llama.cpp reads it (which layers slide, YaRN, the experts' gating), and
malformed files refused with errors that name the key or tensor. Its forwards against llama.cpp's are
tests/engine/test_moe_oracle.py's; its row-wise contract, tests/engine/test_moe.py's."""

import pytest
from gguf.constants import GGUFValueType as V

from engine.errors import ConfigError, GGUFError, UnsupportedOnBackend
from engine.gguf.reader import open_gguf
from engine.models import gpt_oss, load_model
from kernels.backend import OP_ATTENTION_SINKS, SWIGLU_OAI, Gating, RopeScaling
from tests.backends import cpu_without
from tests.moe_models import GPT_OSS, GPT_OSS_WINDOW, assert_refused, write_gpt_oss_model


@pytest.fixture(scope="module")
def metadata(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt-oss") / "m.gguf"
    write_gpt_oss_model(path)
    with open_gguf(path) as file:
        return dict(file.metadata)


@pytest.fixture(scope="module")
def args(metadata):
    return gpt_oss.model_args(metadata)


def test_even_layers_slide_and_odd_ones_attend_globally(args):
    assert [layer.mixer.window for layer in args.layers] == [GPT_OSS_WINDOW, 0]


def test_every_layer_has_sinks_biases_yarn_and_the_softmaxed_top_k(args):
    for layer in args.layers:
        a, f = layer.mixer, layer.feed_forward
        assert a.sinks and a.qkv_bias and a.out_bias
        assert a.rope_scaling == RopeScaling(factor=8.0, yarn=True, n_ctx_orig=64)
        assert (f.gating, f.normalize, f.activation, f.biases) == (Gating.SOFTMAX_WEIGHT, False, SWIGLU_OAI, True)
        assert layer.ffn_norm == "post_attention_norm.weight"


def test_a_per_layer_pattern_says_which_layers_slide(metadata):
    args = gpt_oss.model_args(metadata | {f"{GPT_OSS}.attention.sliding_window_pattern": [False, True]})
    assert [layer.mixer.window for layer in args.layers] == [0, GPT_OSS_WINDOW]


def test_a_missing_sliding_window_is_named(tmp_path):
    assert_refused(write_gpt_oss_model, tmp_path, ConfigError, f"{GPT_OSS}.attention.sliding_window is 0",
                   metadata={f"{GPT_OSS}.attention.sliding_window": (0, V.UINT32)})


def test_an_unknown_rope_scaling_type_is_named(tmp_path):
    assert_refused(write_gpt_oss_model, tmp_path, ConfigError,
                   f"{GPT_OSS}.rope.scaling.type is 'longrope'; supported: none, linear, yarn",
                   metadata={f"{GPT_OSS}.rope.scaling.type": ("longrope", V.STRING)})


def test_a_negative_rope_scaling_factor_is_refused(tmp_path):
    assert_refused(write_gpt_oss_model, tmp_path, ConfigError, f"{GPT_OSS}.rope.scaling.factor must be positive",
                   metadata={f"{GPT_OSS}.rope.scaling.factor": (-2.0, V.FLOAT32)})


def test_missing_sinks_are_named(tmp_path):
    assert_refused(write_gpt_oss_model, tmp_path, GGUFError, "missing tensor 'blk.1.attn_sinks.weight'",
                   skip_tensors=("blk.1.attn_sinks.weight",))


def test_missing_expert_biases_are_named(tmp_path):
    assert_refused(write_gpt_oss_model, tmp_path, GGUFError, "missing tensor 'blk.0.ffn_down_exps.bias'",
                   skip_tensors=("blk.0.ffn_down_exps.bias",))


def test_a_backend_without_attention_sinks_refuses_the_model_by_name(tmp_path):
    path = tmp_path / "m.gguf"
    write_gpt_oss_model(path)
    with pytest.raises(UnsupportedOnBackend, match="need the attention_sinks op.*no-sinks backend"):
        load_model(path, cpu_without(OP_ATTENTION_SINKS, "no-sinks"))
