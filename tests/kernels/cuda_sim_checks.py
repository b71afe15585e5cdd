"""The CUDA backend's checks, run in a child process under numba-cuda's simulator (test_cuda_sim.py starts
it: NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first imported). Prints one JSON object.

Shapes are tiny: the simulator runs every CUDA thread as a Python thread.
"""

import contextlib
import io
import json
import os
import sys
import tempfile

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from app.cli import main
from engine.models import load_model
import kernels.backend as seam
from kernels.backend import select_backend
from kernels.common import gguf_weights
from tests.quant_weights import random_weight
from tests.synthetic import write_tiny_model

FORMATS = (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K)
OUT = 4
DECODE_ROWS, PREFILL_ROWS = 2, 5  # above 4 rows a prefill product takes the tiled kernel


def _format(qtype, cpu, cuda_be, rng) -> dict:
    cols = 256 if qtype in (T.Q4_K, T.Q5_K, T.Q6_K) else 32
    raw = random_weight(qtype, OUT, cols, rng)
    bias = rng.standard_normal(OUT).astype(np.float32)
    x = rng.standard_normal((PREFILL_ROWS, cols)).astype(np.float32)
    w_cpu = cpu.upload_weight(int(qtype), raw, OUT, cols, bias)
    w_dev = cuda_be.upload_weight(int(qtype), raw, OUT, cols, bias)
    # exact: the host's decoding of the blocks (kernels.common), multiplied in float64
    dense = gguf_weights.dequantize(int(qtype), raw).astype(np.float64)
    exact = x @ dense.T + bias
    # the size of a float32 sum's rounding: each of `cols` additions may lose half an ulp of the running sum
    bound = cols * 2.0 ** -24 * (np.abs(x) @ np.abs(dense).T + np.abs(bias))
    x_dev = _to_device(x)
    rows = cuda_be.to_host(cuda_be.linear([w_dev], _to_device(x[:DECODE_ROWS]), True)[0])
    prefill = cuda_be.to_host(cuda_be.linear([w_dev], x_dev, False)[0])
    ids = np.array([3, 0, 3])
    return {
        "row_wise_excess": float(np.max(np.abs(rows - exact[:DECODE_ROWS]) - bound[:DECODE_ROWS])),
        "prefill_excess": float(np.max(np.abs(prefill - exact) - bound)),
        "embed_gap": float(np.max(np.abs(cuda_be.to_host(cuda_be.embed(w_dev, ids, 0.5))
                                          - cpu.embed(w_cpu, ids, 0.5)))),
    }


def _to_device(a):
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(a))


def _eval(path, backend: str, how: str, kv: str) -> np.ndarray:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["eval", path, "--ids", "1,5,7,9,2", "--top", "8", "--backend", backend, "--path", how,
                   "--kv", kv, "--json"])
    assert rc == 0, rc
    rows = json.loads(out.getvalue())["positions"]
    return np.array([r["top_logits"] for r in rows]), np.array([r["top_ids"] for r in rows])


def _model(arch: str, how: str, kv: str, directory: str) -> dict:
    path = os.path.join(directory, f"{arch}.gguf")
    n_head = 1 if kv == "q8_0" else 2  # a q8_0 cache holds heads of whole 32-value blocks
    write_tiny_model(path, arch, n_layers=2, n_embd=32, n_head=n_head, n_head_kv=1, n_ff=32, qtype=T.F16,
                     tokenizer=True, window=3)
    cpu_logits, cpu_ids = _eval(path, "cpu", how, kv)
    dev_logits, dev_ids = _eval(path, "cuda", how, kv)
    return {"max_gap": float(np.max(np.abs(cpu_logits[:, 0] - dev_logits[:, 0]))),
            "top1_agree": bool(np.array_equal(cpu_ids[:, 0], dev_ids[:, 0])),
            "scale": float(np.max(np.abs(cpu_logits)))}


def _q8_0_cache(cpu, cuda_be, rng) -> dict:
    """A q8_0 cache on the device: GGML's block bytes round-trip through it, and a row the device quantizes
    holds what the CPU's encoder makes of the same values."""
    rows = rng.standard_normal((3, 2, 64)).astype(np.float32)
    on_cpu = cpu.kv_store([2], [64], 4, "q8_0")
    on_cpu.write_f32(0, 0, rows, -rows)
    stored_k, stored_v = on_cpu.read(0, 0, 3)
    store = cuda_be.kv_store([2], [64], 4, "q8_0")
    store.write(0, 1, stored_k, stored_v)
    k_back, v_back = store.read(0, 1, 4)
    quantized = cuda_be.kv_store([2], [64], 4, "q8_0")
    flat = _to_device(rows.reshape(3, -1))
    shape = seam.AttentionShape(n_head=2, n_kv=2, head_dim=64, window=0, scale=0.125)
    cuda_be.attention(flat, flat, _to_device(-rows.reshape(3, -1)), [seam.Segment(0, 3, quantized, 0)], 0, shape,
                      False)
    k_dev, v_dev = quantized.read(0, 0, 3)
    return {"round_trip": bool(np.array_equal(k_back, stored_k) and np.array_equal(v_back, stored_v)),
            "quantized_as_cpu": bool(np.array_equal(k_dev, stored_k) and np.array_equal(v_dev, stored_v)),
            "layout": [str(store.row_layout(0)[0]), list(store.row_layout(0)[1])] == ["uint8", [2, 68]]}


def _row_wise_bits(cuda_be, directory: str) -> bool:
    """Rows fed together on the device get the bits of feeding them one at a time (what verification needs)."""
    path = os.path.join(directory, "gemma3-rows.gguf")
    write_tiny_model(path, "gemma3", n_layers=1, n_embd=32, n_head=2, n_head_kv=1, n_ff=32, vocab=32,
                     qtype=T.Q4_0, window=3)
    model = load_model(path, cuda_be)
    one, together = model.new_cache(8), model.new_cache(8)
    model.forward([1, 2], one)
    model.forward([1, 2], together)
    alone = np.stack([model.forward([t], one) for t in (5, 6, 7)])
    rows = model.forward_rows([5, 6, 7], together)
    return bool(np.array_equal(rows, alone)) and all(
        np.array_equal(together.read_rows(0, 0, 5)[i], one.read_rows(0, 0, 5)[i]) for i in (0, 1))


def run() -> dict:
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    rng = np.random.default_rng(7)
    cpu, cuda_be = select_backend("cpu"), select_backend("cuda")
    assert cuda_be.name == "cuda", "the simulator did not start the cuda backend"
    formats = {qtype.name: _format(qtype, cpu, cuda_be, rng) for qtype in FORMATS}
    with tempfile.TemporaryDirectory() as d:
        # qwen2: biases, the prefill path, a q8_0 cache; gemma3: q/k and post norms, GELU, a sliding window,
        # row-wise decode
        models = {f"{arch}-{how}-{kv}": _model(arch, how, kv, d)
                  for arch, how, kv in (("qwen2", "prefill", "q8_0"), ("gemma3", "decode", "f16"))}
        row_wise = _row_wise_bits(cuda_be, d)
    return {"formats": formats, "models": models, "row_wise_bits": row_wise,
            "q8_0_cache": _q8_0_cache(cpu, cuda_be, rng)}


if __name__ == "__main__":
    json.dump(run(), sys.stdout)
