"""A prefill GEMM's rows do not depend on the batch or the threads: shared by the GEMMs' tests."""

import numpy as np

from tests.quant_weights import random_weight


def assert_rows_independent_of_batch_and_threads(gemm, qtype, rows: int) -> None:
    """gemm(qtype, w, X, threads=2) -> Y: each output row is the same sequence of operations in every tile, so
    its bits do not depend on how many rows were fed with it, nor on the threads the weight tiles were split
    over."""
    rng = np.random.default_rng(1 + int(qtype))
    w = random_weight(qtype, rows, 256, rng)
    X = rng.standard_normal((17, 256), dtype=np.float32)
    together = gemm(qtype, w, X)
    for n in (1, 2, 3, 5):
        np.testing.assert_array_equal(gemm(qtype, w, X[:n]), together[:n])
    for threads in (1, 3):
        np.testing.assert_array_equal(gemm(qtype, w, X, threads), together)
