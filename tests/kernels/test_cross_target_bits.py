"""The kernels' bits do not depend on the instructions they were compiled with: the products compiled for the
AVX2 target (x86-64-v3) give this machine's own kernels' bits (AVX-512 and VNNI where it has them), for every
native format, row-wise (decode, verify) and as prefill. The Numba cache keys each compiled kernel by its
target, so a chat saved on one machine continues, bit for bit, on another of a different kind."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from kernels.common import cpu_target
from kernels.cpu import quant
from tests.quant_weights import random_weight

ROOT = Path(__file__).resolve().parents[2]
AVX2 = cpu_target.BY_NAME["x86-64-v3"]

# each format with a native row kernel; columns for a K-quant's super-blocks, an odd count (the kernels pair them)
FORMATS = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K, T.MXFP4]
COLUMNS = 768
ROWS = 64  # a multiple of the integer GEMM's tile on both targets

# the products of seeded weights and inputs, saved as name -> array
PRODUCTS = """
import sys
import numpy as np
from tests.kernels.test_cross_target_bits import products
np.savez(sys.argv[1], **products())
"""


def products() -> dict[str, np.ndarray]:
    out = {}
    for qtype in FORMATS:
        rng = np.random.default_rng(int(qtype))
        w = random_weight(qtype, ROWS, COLUMNS, rng)
        X = rng.standard_normal((21, COLUMNS), dtype=np.float32)  # enough rows for every kind of lanes
        out[f"{qtype.name}-rows"] = quant.rows(qtype, w, X)
        out[f"{qtype.name}-matvec"] = quant.matvec(qtype, w, X[0])
        out[f"{qtype.name}-prefill"] = quant.matmul(qtype, w, np.concatenate([X] * 5))
    return out


def test_products_compiled_for_avx2_give_this_machines_bits(tmp_path):
    if not cpu_target.runs_here(AVX2):
        pytest.skip("this CPU lacks AVX2: it runs no second target")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    env |= {"PYTHONPATH": str(ROOT), cpu_target.ENV: AVX2.name}
    run = subprocess.run([sys.executable, "-c", PRODUCTS, str(tmp_path / "avx2.npz")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = np.load(tmp_path / "avx2.npz")
    ours = products()
    assert set(theirs) == set(ours)
    for name, value in ours.items():
        np.testing.assert_array_equal(theirs[name], value, err_msg=name)
