"""The model seam: a family that differs from llama only in a part the old switchboard could not express
(tests/shared_expert_family.py: a shared expert beside some layers' MLP) lands as one file. Its tensors come
from its parts' table (the synthetic writer and the loader read it), its layers without a fused form run
through the composed ops beside the backend's fused stack, and every row-wise equivalence holds."""

import numpy as np
import pytest

from engine.errors import GGUFError, UnsupportedOnBackend
from engine.models import FAMILIES, load_model, register_family
from kernels.backend import OP_ATTENTION
from kernels.cpu.backend import CpuBackend
from tests import shared_expert_family as family
from tests.synthetic import write_tiny_model

PROMPT, ROWS = [3, 17, 59, 5], [8, 13, 21, 34, 55]
# only the last layer has a shared expert: its tensors are drawn last, so every other weight is the one the
# llama model of the same seed has
WIDTHS = [0, 0, 64]
SHARED_DOWN = "blk.2.ffn_down_shexp.weight"


@pytest.fixture(scope="module", autouse=True)
def registered():
    register_family(family.ARCH, family.model_args)
    yield
    del FAMILIES[family.ARCH]


def _write(path, arch: str, **kw):
    extra = {f"{family.ARCH}.expert_shared_feed_forward_length": WIDTHS} if arch == family.ARCH else None
    write_tiny_model(path, arch, n_layers=len(WIDTHS), family_metadata=extra, **kw)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("seam")
    return {"llama": load_model(_write(d / "llama.gguf", "llama")),
            "shared": load_model(_write(d / "shared.gguf", family.ARCH)),
            "zero shared": load_model(_write(d / "zero.gguf", family.ARCH, fill={SHARED_DOWN: 0.0}))}


def _prefill(model) -> np.ndarray:
    return model.forward_all(PROMPT, model.new_cache(16))


def _decode(model) -> np.ndarray:
    cache = model.new_cache(16)
    model.forward(PROMPT, cache)
    return np.stack([model.forward([t], cache) for t in ROWS])


def test_the_family_s_layers_take_its_part_and_the_fused_stack_takes_the_others(models):
    model = models["shared"]
    assert [type(b.feed_forward).__name__ for b in model.blocks] == ["GatedMlp", "GatedMlp", "SharedExpertMlp"]
    runs = [(len(run.blocks), run.stack is not None) for run in model._row_runs]
    assert runs == [(2, True), (1, False)]


def test_a_shared_expert_of_zeros_leaves_the_llama_model_s_logits(models):
    np.testing.assert_array_equal(_prefill(models["zero shared"]), _prefill(models["llama"]))
    # row-wise: the last layer composed instead of fused, the same arithmetic up to float32 rounding
    np.testing.assert_allclose(_decode(models["zero shared"]), _decode(models["llama"]), rtol=0, atol=2e-4)


def test_the_shared_expert_changes_the_logits(models):
    assert np.abs(_prefill(models["shared"]) - _prefill(models["llama"])).max() > 1e-2


def test_rows_fed_together_get_their_one_row_bits_across_fused_and_composed_layers(models):
    model = models["shared"]
    alone = _decode(model)
    cache = model.new_cache(16)
    model.forward(PROMPT, cache)
    np.testing.assert_array_equal(model.forward_rows(ROWS, cache), alone)
    one = model.new_cache(16)
    model.forward(PROMPT, one)
    for t in ROWS:
        model.forward([t], one)
    for stored, expected in zip(cache.k + cache.v, one.k + one.v):
        np.testing.assert_array_equal(stored, expected)


def test_a_batched_decode_step_gives_each_conversation_its_own_bits(models):
    model = models["shared"]
    caches = [model.new_cache(16) for _ in range(2)]
    for cache, prompt in zip(caches, (PROMPT, PROMPT[:2])):
        model.forward(prompt, cache)
    batched = model.decode_batch([ROWS[0], ROWS[1]], caches)
    for row, prompt, token in zip(batched, (PROMPT, PROMPT[:2]), ROWS):
        cache = model.new_cache(16)
        model.forward(prompt, cache)
        np.testing.assert_array_equal(row, model.forward([token], cache))


def test_a_missing_shared_expert_tensor_is_named(tmp_path):
    path = _write(tmp_path / "m.gguf", family.ARCH, skip_tensors=("blk.2.ffn_up_shexp.weight",))
    with pytest.raises(GGUFError, match="blk.2.ffn_up_shexp.weight"):
        load_model(path)


class _BackendWithoutAttention(CpuBackend):
    name = "no-attention"

    def supports_op(self, op: str) -> bool:
        return op != OP_ATTENTION and super().supports_op(op)


def test_a_backend_without_an_op_the_family_needs_refuses_it_by_name(tmp_path):
    path = _write(tmp_path / "m.gguf", family.ARCH)
    with pytest.raises(UnsupportedOnBackend, match="need the attention op.*no-attention backend"):
        load_model(path, _BackendWithoutAttention())
