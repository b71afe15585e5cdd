"""Every family on tiny random GGUFs: the spec's equivalences and the loader's errors."""

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from engine.errors import GGUFError, InvalidTokenId, UnsupportedArchitecture, WeightShapeError
from engine.gguf.reader import open_gguf
from engine.models import build_model, load_model
from tests.synthetic import write_tiny_model

FAMILIES = ["llama", "qwen2", "qwen3", "gemma3"]
TOKENS = [3, 17, 99, 5, 64, 1, 2, 120, 33, 8, 77, 45, 12, 6, 90, 100, 4, 18]  # crosses gemma3's window of 8


@pytest.fixture(scope="module", params=FAMILIES)
def model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "m.gguf"
    # gemma3 with 6 layers: layers 0-4 sliding, layer 5 global. F16 weights: decode and prefill then
    # differ only by float rounding (block-quantized matvecs quantize activations, see below).
    write_tiny_model(path, request.param, n_layers=6 if request.param == "gemma3" else 2,
                     head_dim=32, tied=request.param != "qwen2", qtype=T.F16)
    return load_model(path)


def test_incremental_decode_equals_full_prefill(model):
    full = model.forward_all(TOKENS, model.new_cache(32))
    cache = model.new_cache(32)
    rows = [model.forward(TOKENS[:5], cache)]
    rows += [model.forward([t], cache) for t in TOKENS[5:]]
    np.testing.assert_allclose(np.stack(rows), full[4:], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q8_0])
def test_quantized_decode_stays_close_to_prefill(tmp_path, qtype):
    """Decode matvecs multiply int8-quantized activations (as llama.cpp), prefill multiplies floats."""
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "llama", qtype=qtype)
    model = load_model(path)
    full = model.forward_all(TOKENS, model.new_cache(32))
    cache = model.new_cache(32)
    rows = np.stack([model.forward(TOKENS[:5], cache)] + [model.forward([t], cache) for t in TOKENS[5:]])
    assert np.abs(rows - full[4:]).mean() < 0.01 * np.abs(full).mean()
    assert (rows.argmax(axis=1) == full[4:].argmax(axis=1)).mean() > 0.9


def test_chunked_prefill_equals_one_shot(model):
    full = model.forward_all(TOKENS, model.new_cache(32))
    cache = model.new_cache(32)
    parts = [model.forward_all(TOKENS[:7], cache), model.forward_all(TOKENS[7:], cache)]
    np.testing.assert_allclose(np.concatenate(parts), full, rtol=1e-3, atol=1e-3)


def test_batched_decode_equals_separate_decodes(model):
    prompts = [TOKENS[:4], TOKENS[5:12], TOKENS[2:3]]
    caches = [model.new_cache(32) for _ in prompts]
    for p, c in zip(prompts, caches):
        model.forward(p, c)
    batch = model.decode_batch([7, 8, 9], caches)
    for p, t, row in zip(prompts, [7, 8, 9], batch):
        c = model.new_cache(32)
        np.testing.assert_allclose(model.forward(list(p) + [t], c), row, rtol=1e-3, atol=1e-3)


def test_q8_0_cache_stays_close_to_f16(model):
    ref = model.forward_all(TOKENS, model.new_cache(32))
    q8 = model.forward_all(TOKENS, model.new_cache(32, "q8_0"))
    assert np.abs(q8 - ref).mean() < 0.05 * np.abs(ref).mean()
    assert (q8.argmax(axis=1) == ref.argmax(axis=1)).mean() > 0.8


def test_context_overflow_and_bad_ids(model):
    cache = model.new_cache(4)
    with pytest.raises(Exception, match="context full"):
        model.forward(TOKENS[:5], cache)
    assert cache.len == 0
    with pytest.raises(InvalidTokenId, match="outside the vocabulary"):
        model.forward([100000], model.new_cache(4))


def test_unsupported_architecture_lists_supported(tmp_path):
    path = tmp_path / "x.gguf"
    write_tiny_model(path, "llama")
    f = open_gguf(path)
    f.metadata["general.architecture"] = "mamba9"
    with pytest.raises(UnsupportedArchitecture,
                       match="'mamba9' is not supported.*deepseek2, gemma3, gemma4, glm4moe, gpt-oss, llama, qwen2, qwen3"):
        build_model(f)


def test_wrong_shape_names_tensor_and_shapes(tmp_path):
    path = tmp_path / "x.gguf"
    write_tiny_model(path, "llama", n_ff=96)
    # declare a wider FFN than the stored tensors have
    f = open_gguf(path)
    f.metadata["llama.feed_forward_length"] = 128
    with pytest.raises(WeightShapeError, match=r"blk\.0\.ffn_gate\.weight.*\[96, 64\].*\[128, 64\]"):
        build_model(f)


def test_missing_tensor_is_named(tmp_path):
    path = tmp_path / "x.gguf"
    write_tiny_model(path, "qwen3", skip_tensors=("blk.1.attn_k_norm.weight",))
    with pytest.raises(GGUFError, match="blk.1.attn_k_norm.weight"):
        load_model(path)


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16])
def test_every_quantizable_format_runs_a_model(tmp_path, qtype):
    path = tmp_path / "x.gguf"
    write_tiny_model(path, "llama", qtype=qtype)
    logits = load_model(path).forward_all(TOKENS[:4], load_model(path).new_cache(8))
    assert np.isfinite(logits).all()


def test_long_prompts_are_fed_in_ubatches(model, monkeypatch):
    from engine.models import transformer
    full = model.forward_all(TOKENS, model.new_cache(32))
    last = model.forward(TOKENS, model.new_cache(32))
    monkeypatch.setattr(transformer, "UBATCH", 5)
    np.testing.assert_allclose(model.forward_all(TOKENS, model.new_cache(32)), full, rtol=1e-3, atol=1e-3)
    cache = model.new_cache(32)
    np.testing.assert_allclose(model.forward(TOKENS, cache), last, rtol=1e-3, atol=1e-3)
    assert cache.len == len(TOKENS)
