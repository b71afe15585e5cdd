"""The row-wise forward's two variants (kernels.cpu.row_variants): a call of one row runs the decode variant,
a call of more the verify variant once it is compiled -- in the background, the decode variant standing in
until then -- and both give the same bits."""

import threading

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from engine.models import load_model
from kernels.cpu.row_variants import RowVariants
from tests.synthetic import write_tiny_model

QTYPES = [int(T.Q4_K), int(T.Q6_K)]


class _SlowKernel:
    """A kernel whose compilation waits for `release` (or fails, with `fail`)."""

    def __init__(self, fail: bool = False):
        self.release = threading.Event()
        self.fail = fail
        self.compiled = []

    def compile(self, sig):
        self.release.wait(10)
        if self.fail:
            raise RuntimeError("no machine code today")
        self.compiled.append(sig)


def test_one_row_runs_the_decode_variant_and_compiles_nothing(separate_decode_kernels):
    kernel = _SlowKernel()
    variants = RowVariants(kernel, QTYPES)
    assert variants.formats_for(1, (np.zeros(3),)) is variants.decode and not variants.decode.lanes
    kernel.release.set()
    assert kernel.compiled == []


def test_many_rows_run_the_decode_variant_until_the_verify_variant_is_compiled(separate_decode_kernels):
    kernel = _SlowKernel()
    variants = RowVariants(kernel, QTYPES)
    args = (np.zeros((5, 4), np.float32), 2)
    assert variants.formats_for(5, args) is variants.decode  # compiling now, on its own thread
    assert variants.formats_for(8, args) is variants.decode  # one compilation, not one per call
    kernel.release.set()
    assert variants.ready(args, wait=True)
    assert variants.formats_for(5, args) is variants.verify and variants.verify.lanes
    assert len(kernel.compiled) == 1 and kernel.compiled[0][0].lanes  # compiled for the lanes' format set


def test_other_argument_types_compile_a_verify_variant_of_their_own(separate_decode_kernels):
    kernel = _SlowKernel()
    kernel.release.set()
    variants = RowVariants(kernel, QTYPES)
    assert variants.ready((np.zeros((5, 4), np.float32),), wait=True)
    kernel.release.clear()
    assert not variants.ready((np.zeros((5, 4), np.uint8),))  # e.g. another cache type
    kernel.release.set()
    assert variants.ready((np.zeros((5, 4), np.uint8),), wait=True)
    assert len(kernel.compiled) == 2


def test_a_verify_variant_that_fails_to_compile_leaves_the_decode_variant_serving(separate_decode_kernels, caplog):
    kernel = _SlowKernel(fail=True)
    kernel.release.set()
    variants = RowVariants(kernel, QTYPES)
    args = (np.zeros((5, 4), np.float32),)
    assert not variants.ready(args, wait=True)
    assert variants.formats_for(6, args) is variants.decode
    assert "did not compile" in caplog.text


def _decode_and_verify_variants_agree(model):
    prompt = [3, 17, 59, 5]
    rows = [int(t) for t in np.random.default_rng(0).integers(0, model.vocab_size, 12)]
    variants = model._row_runs[0].stack.variants  # the one run: every layer fused
    out = {}
    for name in ("decode", "verify"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(variants, "formats_for", lambda m, args, name=name: getattr(variants, name))
            cache = model.new_cache(len(prompt) + len(rows) + 1)
            model.forward(prompt, cache)
            logits = [model.forward_rows(rows, cache), model.forward([rows[0]], cache)[None]]
            out[name] = (np.concatenate(logits), [a.copy() for a in cache.k + cache.v])
    np.testing.assert_array_equal(out["decode"][0], out["verify"][0])
    for a, b in zip(out["decode"][1], out["verify"][1]):
        np.testing.assert_array_equal(a, b)


def test_the_decode_variant_gives_the_verify_variants_bits(tmp_path):
    """What a verify step computes while its kernels compile is what it computes after (12 rows: every
    lane kernel runs in the verify variant), and a one-row step alike."""
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "qwen2", n_layers=2, n_embd=256, n_head=8, n_head_kv=2, head_dim=32, n_ff=256, vocab=64,
                     qtype=T.Q4_K)
    _decode_and_verify_variants_agree(load_model(path))


def test_the_variants_agree_on_a_starter_model(model_path):
    """Qwen2.5's four weight formats (Q5_0, Q8_0, Q4_K, Q6_K) and seven query heads a kv head."""
    _decode_and_verify_variants_agree(load_model(model_path("qwen2.5-coder-0.5b-instruct")))
