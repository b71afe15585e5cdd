"""Throughput of the CPU quantized-weight kernels (kernels/cpu/quant.py).

For every native format and a few realistic shapes (Qwen2.5-0.5B's attention,
MLP and output projections) it prints, for decode (matvec, one input row) the
weight bytes streamed per second and GFLOP/s, and for prefill (matmul with
n=512 input rows) GFLOP/s next to NumPy's own f32 sgemm on the same shape.
With --rows 4,8,16 it prints instead what a row-wise product (quant.rows, the
decode and verify product) of that many input rows costs, in one-row products.

    python3 -m benchmarks.bench_quant_kernels [--formats Q4_K,Q8_0] [--shapes 896x896] [--threads 2]
    python3 -m benchmarks.bench_quant_kernels --rows 4,8,16 [--formats ...] [--shapes ...]

Timings are the best of several runs (other processes on the machine only ever
slow a run down). On a machine shared with other busy processes, set
OMP_WAIT_POLICY=passive: OpenMP's default spin-waiting then stalls threaded
calls for milliseconds. Weights are random blocks with sane f16 scales (from
tests/quant_weights.py). K-quant rows hold whole 256-weight super-blocks, so
for them 896 columns become 1024.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from kernels.cpu import quant
from tests.quant_weights import random_weight

FORMATS = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
SHAPES = ["896x896", "4864x896", "896x4864", "151936x896"]


def best_time(fn, repeat: int, budget_s: float = 2.0) -> float:
    fn()  # compile / warm caches
    best, spent, runs = float("inf"), 0.0, 0
    while runs < repeat and (spent < budget_s or runs < 2):
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        best, spent, runs = min(best, dt), spent + dt, runs + 1
    return best


def cases(args):
    """(format name, GGML type, rows, columns) for every shape and format asked for; columns rounded up to
    whole blocks of the format."""
    for shape in args.shapes.split(","):
        rows, shape_cols = (int(v) for v in shape.split("x"))
        for name in args.formats.split(","):
            qtype = T[name]
            block_elems = GGML_QUANT_SIZES[qtype][0]
            yield name, qtype, rows, -(-shape_cols // block_elems) * block_elems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--shapes", default=",".join(SHAPES), help="rows x cols, comma separated")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--batch", type=int, default=512, help="input rows for the matmul (prefill) column")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--rows", default="", help="input row counts for the row-wise cost table (comma separated)")
    args = ap.parse_args()
    if args.threads:
        quant.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    if args.rows:
        row_costs(args, rng, [int(m) for m in args.rows.split(",")])
        return
    n = args.batch

    print(f"{'format':6} {'shape':>11} {'MB':>7} | {'matvec us':>9} {'GB/s':>6} {'GFLOP/s':>7} |"
          f" {'matmul ms':>9} {'GFLOP/s':>7} {'sgemm':>6}")
    sgemm_cache: dict[tuple[int, int], float] = {}
    for name, qtype, rows, cols in cases(args):
        X = rng.standard_normal((n, cols), dtype=np.float32)
        x = X[0].copy()
        flops_mv, flops_mm = 2.0 * rows * cols, 2.0 * n * rows * cols
        if (rows, cols) not in sgemm_cache:  # NumPy f32 GEMM on one 4 MB tile shape: the ceiling
            tile = rng.standard_normal((min(rows, (4 << 20) // (4 * cols)), cols), dtype=np.float32)
            t = best_time(lambda: X @ tile.T, 10)
            sgemm_cache[rows, cols] = 2.0 * n * tile.shape[0] * cols / t / 1e9
        w = random_weight(qtype, rows, cols, rng)
        out = np.empty(rows, np.float32)
        t_mv = best_time(lambda: quant.matvec(qtype, w, x, out), args.repeat)
        t_mm = best_time(lambda: quant.matmul(qtype, w, X), 3, budget_s=3.0)
        print(f"{name:6} {f'{rows}x{cols}':>11} {w.nbytes / 1e6:7.1f} |"
              f" {t_mv * 1e6:9.0f} {w.nbytes / t_mv / 1e9:6.1f} {flops_mv / t_mv / 1e9:7.1f} |"
              f" {t_mm * 1e3:9.1f} {flops_mm / t_mm / 1e9:7.1f} {sgemm_cache[rows, cols]:6.0f}", flush=True)
        del w


def row_costs(args, rng, counts: list[int]) -> None:
    """For each format and shape: the time of a one-row product, and of m-row products in one-row units."""
    print(f"{'format':6} {'shape':>11} {'1 row us':>9} | " + " ".join(f"{f'{m} rows':>8}" for m in counts))
    for name, qtype, rows, cols in cases(args):
        w = random_weight(qtype, rows, cols, rng)
        X = rng.standard_normal((max(counts), cols), dtype=np.float32)
        one = best_time(lambda: quant.rows(qtype, w, X[:1]), args.repeat)
        ratios = [best_time(lambda: quant.rows(qtype, w, X[:m]), args.repeat) / one for m in counts]
        print(f"{name:6} {f'{rows}x{cols}':>11} {one * 1e6:9.0f} | " + " ".join(f"{r:8.2f}" for r in ratios),
              flush=True)
        del w


if __name__ == "__main__":
    main()
