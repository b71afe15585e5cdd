"""qwen3moe and gpt-oss on the tiny random models of tests/moe_models.py: the row-wise contract (m rows in one
call are, bit for bit, the tokens fed one at a time; so a batched step is each conversation alone and
speculative decoding yields the plain ids; deepseek2's and glm4moe's models too), the experts read in place from the file,
and malformed files refused with errors that name the key or tensor."""

import warnings

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T, GGUFValueType as V

from engine.errors import ConfigError, GGUFError, SlowWeightTypeWarning, UnsupportedOnBackend, WeightShapeError
from engine.models import load_model
from engine.models.experts import MoeFfn
from engine.models.transformer import _RowRun
from engine.sampling import SamplerConfig
from kernels.backend import OP_MOE_FFN
from tests.backends import cpu_without
from tests.moe_models import (
    ARCH, DEEPSEEK2, DEEPSEEK2_VARIANTS, GLM4MOE, GLM4MOE_VARIANTS, GPT_OSS, GPT_OSS_VARIANTS, N_EXPERT, N_FF_EXP,
    ORACLE_MODELS, TOKENS, VARIANTS, write_moe_model,
)
from tests.row_wise import (
    assert_batched_step_equals_each_alone, assert_rows_equal_one_at_a_time, assert_speculative_yields_the_plain_ids,
)

ROW_COUNTS = (1, 2, 5, 8, 17)  # one call of each size, in turn, after a short prefilled prompt
PROMPT = TOKENS[:4]


# each family in each experts' format (gpt-oss's: past its sliding window too); the spec's equivalences hold
# on deepseek2's and glm4moe's too, whose layers (latent attention, shared experts) run through the composed ops
MODELS = ([f"{ARCH}-{v}" for v, (_, extra) in VARIANTS.items() if not extra]
          + [f"{GPT_OSS}-{v}" for v in GPT_OSS_VARIANTS])
EVERY_FAMILY = (MODELS + [f"{DEEPSEEK2}-{v}" for v in DEEPSEEK2_VARIANTS]
                + [f"{GLM4MOE}-{v}" for v in GLM4MOE_VARIANTS])


def _load(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("moe") / f"{request.param}.gguf"
    ORACLE_MODELS[request.param][0](path)
    return load_model(path)


@pytest.fixture(scope="module", params=MODELS)
def model(request, tmp_path_factory):
    return _load(request, tmp_path_factory)


@pytest.fixture(scope="module", params=EVERY_FAMILY)
def any_model(request, tmp_path_factory):
    return _load(request, tmp_path_factory)


def test_rows_equal_one_at_a_time(any_model):
    assert_rows_equal_one_at_a_time(any_model, row_counts=ROW_COUNTS, prompt=PROMPT)


def test_a_batched_decode_step_equals_each_conversation_alone(any_model):
    assert_batched_step_equals_each_alone(any_model, [TOKENS[:3], TOKENS[5:11], TOKENS[20:22]], [7, 100, 258])


@pytest.mark.parametrize("config", [SamplerConfig(), SamplerConfig(temperature=0.8, top_k=20, seed=3)],
                         ids=["greedy", "seeded"])
def test_speculative_decoding_yields_the_plain_ids(any_model, config, monkeypatch):
    assert_speculative_yields_the_plain_ids(any_model, TOKENS[:6] * 3, config, monkeypatch)


def test_every_layer_decodes_in_the_fused_row_stack(model):
    assert [run.stack is not None for run in model._row_runs] == [True]


def test_the_fused_row_stack_decodes_as_the_composed_ops_do(model, monkeypatch):
    prompt_and_rows = [int(t) for t in TOKENS[:12]]

    def decode():
        cache = model.new_cache(len(prompt_and_rows))
        model.forward(PROMPT, cache)
        return np.stack([model.forward([t], cache) for t in prompt_and_rows[len(PROMPT):]])

    fused = decode()
    monkeypatch.setattr(model, "_row_runs", [_RowRun(model.blocks, None)])
    # the same products and experts' kernel; the composed norms and attention round differently
    np.testing.assert_allclose(fused, decode(), rtol=0, atol=2e-4)


def test_every_layer_is_experts_read_in_place_from_the_file(model):
    for i, block in enumerate(model.blocks):
        assert isinstance(block.feed_forward, MoeFfn)
        stacked = model.file.raw(model.file.tensor(f"blk.{i}.ffn_down_exps.weight"))
        experts = block.feed_forward.experts
        assert (experts.n_expert, experts.n_used, experts.down.out_dim) == (N_EXPERT, 2, stacked.shape[0])
        # the stacked tensor itself, in the file's format: a view of the file's bytes
        assert experts.down.raw.ctypes.data == stacked.ctypes.data and experts.down.raw.shape == stacked.shape


def test_more_experts_used_than_there_are_is_refused(tmp_path):
    path = tmp_path / "m.gguf"
    write_moe_model(path, metadata={f"{ARCH}.expert_used_count": (N_EXPERT + 1, V.UINT32)})
    with pytest.raises(ConfigError, match=f"{ARCH}.expert_used_count is 9; it must be between 1 and expert_count"):
        load_model(path)


def test_a_missing_expert_tensor_is_named(tmp_path):
    path = tmp_path / "m.gguf"
    write_moe_model(path, skip_tensors=("blk.1.ffn_down_exps.weight",))
    with pytest.raises(GGUFError, match="missing tensor 'blk.1.ffn_down_exps.weight'"):
        load_model(path)


def test_experts_of_another_width_than_the_metadata_says_are_refused(tmp_path):
    path = tmp_path / "m.gguf"
    write_moe_model(path, metadata={f"{ARCH}.expert_feed_forward_length": (N_FF_EXP // 2, V.UINT32)})
    with pytest.raises(WeightShapeError, match=r"'blk.0.ffn_gate_exps.weight' has shape \[8, 256, 256\], "
                                               r"expected \[8, 128, 256\] \(expert, out, in\)"):
        load_model(path)


def test_experts_without_a_native_kernel_run_the_generic_path_row_wise_and_are_named_in_a_warning(tmp_path):
    path = tmp_path / "iq4_nl.gguf"
    write_moe_model(path, expert_qtype=T.IQ4_NL)
    named = r"6 weight\(s\) are IQ4_NL \(blk.0.ffn_gate_exps.weight, blk.0.ffn_up_exps.weight, "
    with pytest.warns(SlowWeightTypeWarning, match=named + r"blk.0.ffn_down_exps.weight and 3 more\)"):
        model = load_model(path)
    assert [run.stack for run in model._row_runs] == [None]  # the fused stack has no generic path
    tokens = [int(t) for t in TOKENS[:9]]
    cache = model.new_cache(len(tokens))
    rows = model.forward_rows(tokens, cache)
    one = model.new_cache(len(tokens))
    np.testing.assert_array_equal(rows, np.stack([model.forward([t], one) for t in tokens]))
    prefill = model.forward_all(tokens, model.new_cache(len(tokens)))
    np.testing.assert_allclose(rows, prefill, rtol=0, atol=0.05 * np.abs(prefill).max())


def test_a_model_of_native_formats_gives_no_slow_type_warning(tmp_path):
    path = tmp_path / "q4_k.gguf"
    write_moe_model(path, "q4_k")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowWeightTypeWarning)
        load_model(path)


def test_a_backend_without_the_experts_op_refuses_the_model_by_name(tmp_path):
    path = tmp_path / "m.gguf"
    write_moe_model(path)
    with pytest.raises(UnsupportedOnBackend, match="need the moe_ffn op.*no-experts backend"):
        load_model(path, cpu_without(OP_MOE_FFN, "no-experts"))
