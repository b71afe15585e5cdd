"""The CUDA backend against the CPU backend, under numba-cuda's simulator (no GPU needed).

The checks run once, in a child process (tests/kernels/cuda_sim_checks.py), because NUMBA_ENABLE_CUDASIM
must be set before numba.cuda is first imported, which another test may already have done here.

Tolerances. A product is compared with the exact (float64) product of the weights as the CPU backend
decodes the blocks: the device sums in float32, in its own order, so each output may be off by at most
cols * 2^-24 * sum|x_c w_c| (half an ulp of the running sum per addition); the check is that no output
exceeds that bound. (The CPU's own product is no tighter reference: its int8 kernels quantize the
activations.) The embedding decodes each value with the same single rounding as the CPU, so it is equal.
A whole model (F16 weights, whose CPU kernel multiplies in float32 too) agrees on every position's top
token, its logit within 1e-3 of logits of magnitude ~20 (the eval output rounds to 1e-5). A q8_0 cache
on the device quantizes exactly as the CPU's encoder (same float32 steps, the scale rounded to f16 the
same way), so its bytes are compared for equality.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORMATS = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


@pytest.fixture(scope="module")
def results() -> dict:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT))
    # -X faulthandler: a crash in the child prints where it was
    child = [sys.executable, "-X", "faulthandler", str(ROOT / "tests" / "kernels" / "cuda_sim_checks.py")]
    done = subprocess.run(child, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("fmt", FORMATS)
def test_products_read_every_format_within_float32_rounding(results, fmt):
    r = results["formats"][fmt]
    assert r["row_wise_excess"] <= 0, r  # matvec, the decode product
    assert r["prefill_excess"] <= 0, r  # the tiled product


@pytest.mark.parametrize("fmt", FORMATS)
def test_embedding_rows_equal_the_cpu_backend(results, fmt):
    assert results["formats"][fmt]["embed_gap"] == 0


@pytest.mark.parametrize("case", ["qwen2-prefill-q8_0", "gemma3-decode-f16"])
def test_tiny_model_through_the_cli_agrees_with_the_cpu(results, case):
    r = results["models"][case]
    assert r["top1_agree"], r
    assert r["max_gap"] <= 1e-3, r


def test_a_q8_0_cache_on_the_device_stores_ggml_blocks(results):
    assert results["q8_0_cache"] == {"round_trip": True, "quantized_as_cpu": True, "layout": True}


def test_rows_fed_together_on_the_device_get_their_one_row_bits(results):
    assert results["row_wise_bits"] is True
