"""Multiply by GGUF weights in their stored format (spec 13.2: weights stay in source precision).

A weight is its raw GGUF bytes: a C-contiguous uint8 array [rows, row_bytes],
a view of the file's mmap or the backend's copy in huge pages (resident.py), plus its GGML type id. F32, F16,
BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K and MXFP4 have Numba kernels that read
the blocks directly; every other type `gguf.quants` can dequantize goes through
one generic path (row tiles dequantized, multiplied with NumPy).

Two products, with different numerics:
- `rows` (and `matvec`, its one-row case) is the row-wise product of decode and
  verification: each input row's outputs are computed exactly as for that row
  alone, for any number of rows, and the weight blocks are read once for all rows.
- `matmul` is the prefill product: the same block kernels for a few rows; past
  that the int8 GEMM of kernels/cpu/lane_gemm.py for the K-quants it takes, or the
  integer GEMM of kernels/cpu/int_gemm.py for the formats it packs (their
  rows do not depend on the batch either, but their bits differ from the
  row-wise product's), and dequantized row tiles of a few MB handed to OpenBLAS
  sgemm for the rest, whose results depend on the batch shape (deterministic for
  a given shape).
"""

from __future__ import annotations

from itertools import accumulate

import numba
import numpy as np

from kernels import blas_core
from kernels.common import formats
from kernels.common import quant_blocks as blocks
from kernels.common import quant_generic as generic
from kernels.common.gguf_weights import checked, decode, has_native_kernel, type_name
from kernels.cpu import int_gemm, lane_gemm
from kernels.cpu import quant_dot as dot

_TILE_BYTES = 4 << 20  # float32 tile of dequantized rows in GEMMs: big enough for sgemm, fits in L3
# matmul inputs up to this many rows use the block kernels (weights read once, int8 dots, each weight
# block unpacked once per tile of input rows); past it the integer GEMM wins, whose repacking of every
# weight tile costs the same however few rows pass over it (2 threads, AVX-512 VNNI Xeon, block kernels /
# int GEMM: 16 rows 0.22-0.45, 32 rows 0.44-0.71, 64 rows 0.64-1.03 over the starters' and the MoE shapes'
# Q8_0, Q4_K and Q6_K matrices: a short prompt, the commonest, took twice as long through the GEMM). The
# K-quants' int8 GEMM starts sooner (lane_gemm.MATMUL_FROM_ROWS)
_MATVEC_MAX_ROWS = 48

_PARALLEL_MIN_BYTES = dot.PARALLEL_MIN_BYTES
# multiply-adds from which a product on OpenBLAS gets every kernel thread: ~10 ms of it on two cores. Its
# spare threads spin for a while after each call; beside a Qwen3.5 prefill's routers (512 x 2048 x 64) they
# made the experts next to them 1.6x slower
_BLAS_LEND_MACS = 1 << 31
_threads: int | None = None  # None: follow numba's own setting


def set_num_threads(n: int) -> None:
    """Threads used by every kernel, whichever thread calls them."""
    global _threads
    limit = numba.config.NUMBA_NUM_THREADS
    if not 1 <= n <= limit:
        raise ValueError(f"thread count must be between 1 and {limit}, got {n}")
    _threads = n
    numba.set_num_threads(n)


def threads() -> int:
    """The kernel thread count, applied to the calling thread (numba keeps it per thread)."""
    if _threads is not None and numba.get_num_threads() != _threads:
        numba.set_num_threads(_threads)
    return numba.get_num_threads()


# --- validation ---------------------------------------------------------------


def _inputs(x: np.ndarray, ndim: int, cols: int, w: np.ndarray, qtype: int) -> np.ndarray:
    """x as writable contiguous float32 (the type the fused kernels pass, so the product kernels compile
    once) whose last axis matches the weight's columns."""
    x = np.asarray(x)
    if x.ndim != ndim or x.shape[-1] != cols:
        expected = f"[{cols}]" if ndim == 1 else f"[n, {cols}]"
        raise ValueError(
            f"input of shape {x.shape} does not fit a {type_name(qtype)} weight of shape {w.shape} "
            f"({cols} columns): expected {expected}"
        )
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x if x.flags.writeable else x.copy()


# --- public API -----------------------------------------------------------------


def kernel_weight(qtype: int, w: np.ndarray) -> np.ndarray:
    """The checked read-only view of w that fused kernels take (as matvec checks it)."""
    return checked(qtype, w)[0]


def matvec(qtype: int, w: np.ndarray, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """y[r] = sum_c W[r, c] * x[c] as float32 [rows] (written into `out` when given)."""
    w, cols = checked(qtype, w)
    x = _inputs(x, 1, cols, w, qtype)
    n_rows = w.shape[0]
    if out is None:
        out = np.empty(n_rows, np.float32)
    elif out.dtype != np.float32 or out.shape != (n_rows,) or not out.flags.c_contiguous:
        raise ValueError(f"out must be contiguous float32 of shape ({n_rows},), got {out.dtype} {out.shape}")
    _rows_into(qtype, (w,), x[None], out[None])
    return out


def rows(qtype: int, w: np.ndarray, X: np.ndarray) -> np.ndarray:
    """X float32 [n, cols] -> X @ W.T, float32 [n, rows], row i bitwise equal to matvec(w, X[i])."""
    w, cols = checked(qtype, w)
    X = _inputs(X, 2, cols, w, qtype)
    Y = np.empty((X.shape[0], w.shape[0]), np.float32)
    _rows_into(qtype, (w,), X, Y)
    return Y


def matmul(qtype: int, w: np.ndarray, X: np.ndarray) -> np.ndarray:
    """X float32 [n, cols] -> X @ W.T, float32 [n, rows]."""
    w, cols = checked(qtype, w)
    X = _inputs(X, 2, cols, w, qtype)
    n, rows = X.shape[0], w.shape[0]
    Y = np.empty((n, rows), np.float32)
    if _row_kernels_take(qtype, n):
        _rows_into(qtype, (w,), X, Y)
    elif lane_gemm.supports(qtype):
        lane_gemm.matmul_into(qtype, w, X, Y, threads())
    elif int_gemm.supports(qtype, rows):
        int_gemm.matmul_into(qtype, w, X, Y, threads())
    elif n:
        # the product is OpenBLAS's alone: it may have every thread, if it is long enough to pay for their
        # spinning after it, which takes the cores from the kernels next (a MoE router's product is not)
        lend = threads() if n * rows * cols >= _BLAS_LEND_MACS else 1
        with blas_core.threads(lend):
            for r0, r1, tile in _dequantized_tiles(qtype, w, cols):
                np.matmul(X, tile.T, out=Y[:, r0:r1])
    return Y


def _row_kernels_take(qtype: int, n: int) -> bool:
    """Whether a product of n input rows runs on the row-wise block kernels rather than a GEMM."""
    gemm_from = lane_gemm.MATMUL_FROM_ROWS[qtype] if lane_gemm.supports(qtype) else _MATVEC_MAX_ROWS + 1
    return has_native_kernel(qtype) and n < min(gemm_from, _MATVEC_MAX_ROWS + 1)


def gather_rows(qtype: int, w: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Rows W[ids] as float32 [len(ids), cols] (the embedding lookup)."""
    w, cols = checked(qtype, w)
    ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= w.shape[0]):
        bad = ids[(ids < 0) | (ids >= w.shape[0])][0]
        raise IndexError(f"row {bad} is outside a {type_name(qtype)} weight with {w.shape[0]} rows")
    return decode(qtype, w, ids, cols)


# --- paths ----------------------------------------------------------------------


def _row_starts(ws: tuple[np.ndarray, ...]) -> list[int]:
    """Where each weight's rows start in the stacked output, plus the total."""
    return list(accumulate((w.shape[0] for w in ws), initial=0))


def _rows_into(qtype: int, ws: tuple[np.ndarray, ...], X: np.ndarray, Y: np.ndarray) -> None:
    """Y[n] = the stacked products of ws with X[n] (Y[n, starts[i]:starts[i+1]] for weight i), row-wise."""
    if not has_native_kernel(qtype):  # one row at a time, so each row's numerics are its own
        for x, y in zip(X, Y):
            for w, row0 in zip(ws, _row_starts(ws)):
                for r0, r1, tile in _dequantized_tiles(qtype, w, x.shape[0]):
                    np.matmul(tile, x, out=y[row0 + r0 : row0 + r1])
    elif X.shape[0]:
        chunks = threads() if sum(w.nbytes for w in ws) >= _PARALLEL_MIN_BYTES else 1
        dot.products(formats.of([qtype]), *dot.stack([qtype] * len(ws), ws), X, Y, chunks)


def _dequantized_tiles(qtype: int, w: np.ndarray, cols: int):
    """Yield (r0, r1, float32 rows r0..r1) in tiles of about _TILE_BYTES, reusing one buffer."""
    rows = w.shape[0]
    tile_rows = max(1, min(rows, _TILE_BYTES // max(1, 4 * cols)))
    buf = np.empty((tile_rows, cols), np.float32) if has_native_kernel(qtype) else None
    for r0 in range(0, rows, tile_rows):
        r1 = min(rows, r0 + tile_rows)
        if buf is None:
            yield r0, r1, generic.dequantize_rows(qtype, w[r0:r1])
        else:
            blocks.decode_rows(formats.of([qtype]), qtype, w, np.arange(r0, r1, dtype=np.int64), buf[: r1 - r0],
                               blocks.N16)
            yield r0, r1, buf[: r1 - r0]
