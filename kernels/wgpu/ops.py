"""The GPU kernels, one function per op: each queues a dispatch on the device (results come back on read).

Weights are GGUF bytes uploaded once (`upload_weight`) and read in their block format by the shaders.
Activations are f32 buffers of row-major [rows, cols] matrices. Every op computes each row on its own, in
the same order whatever the number of rows, so a row's results do not depend on its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from kernels.wgpu.device import WORKGROUP, Gpu, shader

# GGML type -> the shader file that reads its blocks
FORMATS = {T.F32: "f32", T.F16: "f16", T.BF16: "bf16", T.Q4_0: "q4_0", T.Q4_1: "q4_1", T.Q8_0: "q8_0",
           T.Q4_K: "q4_k", T.Q6_K: "q6_k"}
SILU, GELU = 0, 1
_MATMUL_TILE = 8  # input rows per workgroup (matmul.wgsl's MT; 16 or 32 were no faster on lavapipe)
# threads per weight row (matmul.wgsl's TPR): lavapipe ran the 49152-row output matrix of SmolLM2 8x faster at 4
# than at 64 (a workgroup per row); 1 and 16 were slower
_MATMUL_TPR = 4
_ROW_GROUPS = 32768  # output rows per dispatch dimension before folding into z


class UnsupportedGpuWeight(ValueError):
    """A weight whose GGML type no shader reads."""


def supports(qtype: int) -> bool:
    return qtype in FORMATS


@dataclass
class Chunk:
    row0: int
    rows: int
    buffer: object


@dataclass
class Weight:
    """A GGUF weight resident on the device, in row chunks that each fit one storage binding."""

    qtype: int
    rows: int
    cols: int
    row_bytes: int
    chunks: list[Chunk]


def upload_weight(gpu: Gpu, qtype: int, raw: np.ndarray) -> Weight:
    """raw: the weight's GGUF bytes, uint8 [rows, row_bytes]."""
    if qtype not in FORMATS:
        raise UnsupportedGpuWeight(f"GGML type {_name(qtype)} has no GPU kernel")
    block_elems, block_bytes = GGML_QUANT_SIZES[T(qtype)]
    rows, row_bytes = raw.shape
    per_chunk = max(1, gpu.max_binding // row_bytes)
    chunks = [Chunk(r0, min(rows, r0 + per_chunk) - r0, gpu.upload(raw[r0 : r0 + per_chunk]))
              for r0 in range(0, rows, per_chunk)]
    return Weight(int(qtype), rows, row_bytes // block_bytes * block_elems, row_bytes, chunks)


def _name(qtype: int) -> str:
    try:
        return T(qtype).name
    except ValueError:
        return f"id {qtype}"


def _block_pipeline(gpu: Gpu, op: str, qtype: int):
    name = FORMATS[T(qtype)]
    tiles = f"const MT: u32 = {_MATMUL_TILE}u;\nconst TPR: u32 = {_MATMUL_TPR}u;\n"
    return gpu.pipeline(f"{op}_{name}", tiles + shader("blocks") + shader(name) + shader(op))


def _params(*fields) -> np.ndarray:
    """A uniform block of u32 and f32 fields in order (floats given as np.float32)."""
    return np.array([np.float32(f).view(np.uint32) if isinstance(f, np.float32) else f for f in fields],
                    np.uint32)


def _elementwise_groups(total: int) -> tuple[int, int, int]:
    groups = max(1, -(-total // WORKGROUP))
    x = min(groups, 65535)
    return x, -(-groups // x), 1


def matmul(gpu: Gpu, w: Weight, x, m: int, y, bias=None, out_stride: int | None = None, out_offset: int = 0) -> None:
    """y[r, out_offset + i] = (x[r] @ W.T)[i] (+ bias[i]) for the m rows of x [m, cols]; y rows out_stride apart."""
    stride = w.rows if out_stride is None else out_stride
    pipeline = _block_pipeline(gpu, "matmul", w.qtype)
    for c in w.chunks:
        workgroups = -(-c.rows // (WORKGROUP // _MATMUL_TPR))
        groups = min(workgroups, _ROW_GROUPS)
        params = _params(c.rows, w.cols, m, w.row_bytes, stride, out_offset, c.row0, groups, int(bias is not None))
        # the bias binding needs a buffer even when unused: x stands in (bound read-only already)
        gpu.dispatch(pipeline, params, [c.buffer, x, y, x if bias is None else bias],
                     (groups, -(-m // _MATMUL_TILE), -(-workgroups // groups)))


def get_rows(gpu: Gpu, w: Weight, ids, n: int, out, scale: float = 1.0) -> None:
    """out [n, cols] = W[ids] * scale (ids a u32 buffer)."""
    pipeline = _block_pipeline(gpu, "get_rows", w.qtype)
    for c in w.chunks:
        gpu.dispatch(pipeline, _params(w.cols, w.row_bytes, np.float32(scale), c.row0, c.rows),
                     [c.buffer, ids, out], (n, 1, 1))


def rmsnorm(gpu: Gpu, x, weight, out, n: int, rows: int, eps: float, *, heads: int = 1,
            stride: int | None = None, offset: int = 0) -> None:
    """RMSNorm over each n-float vector: `rows` rows of `heads` vectors each, rows `stride` floats apart."""
    stride = n * heads if stride is None else stride
    gpu.dispatch(gpu.pipeline("rmsnorm", shader("rmsnorm")), _params(n, heads, stride, offset, np.float32(eps)),
                 [x, weight, out], (heads, rows, 1))


def rope_table(gpu: Gpu, n_rot: int, base: float, positions: int):
    """cos/sin [positions, n_rot / 2, 2] for RoPE, computed in double precision as the CPU kernel does."""
    half = n_rot // 2
    inv = base ** (-2.0 * np.arange(half) / n_rot)
    theta = np.arange(positions)[:, None] * inv[None, :]
    return gpu.upload(np.stack([np.cos(theta), np.sin(theta)], axis=-1).astype(np.float32))


def rope(gpu: Gpu, x, table, positions, n: int, heads: int, head_dim: int, n_rot: int, neox: bool, *,
         stride: int | None = None, offset: int = 0) -> None:
    """Rotate the first n_rot dims of each head of n rows in place, row r at positions[r] (a u32 buffer)."""
    stride = heads * head_dim if stride is None else stride
    half = n_rot // 2
    params = _params(heads, head_dim, half, int(neox), stride, offset, n)
    gpu.dispatch(gpu.pipeline("rope", shader("rope")), params, [x, table, positions],
                 (max(1, -(-(n * heads * half) // WORKGROUP)), 1, 1))


def gated(gpu: Gpu, gate, up, out, total: int, act: int) -> None:
    """out = act(gate) * up over `total` floats (act SILU or GELU)."""
    gpu.dispatch(gpu.pipeline("gated", shader("gated")), _params(total, act), [gate, up, out],
                 _elementwise_groups(total))


def add(gpu: Gpu, x, y, out, total: int) -> None:
    """out = x + y over `total` floats."""
    gpu.dispatch(gpu.pipeline("add", shader("add")), _params(total), [x, y, out], _elementwise_groups(total))


def kv_store(gpu: Gpu, kv_dtype: str, k, v, k_cache, v_cache, n: int, width: int, row0: int,
             src_row0: int = 0) -> None:
    """Cache rows row0.. = rows src_row0.. of k and v [rows, width] (width floats per row, even). kv_dtype
    "q8_0" writes an f32 cache with the values q8_0 rounding gives (width a multiple of 32)."""
    if kv_dtype == "q8_0":
        pipeline, per_thread = gpu.pipeline("kv_store_q8_0", shader("kv_store_q8_0")), 32
    else:
        pipeline = gpu.pipeline(f"kv_store_{kv_dtype}", shader(f"kv_store_{kv_dtype}") + shader("kv_store"))
        per_thread = 2
    gpu.dispatch(pipeline, _params(width, n, src_row0, row0), [k, k_cache, v_cache, v],
                 _elementwise_groups(n * width // per_thread))


def attention(gpu: Gpu, kv_dtype: str, q, k_cache, v_cache, scores, out, n: int, n_head: int, kv_heads: int,
              head_dim: int, pos0: int, window: int, scale: float, q_row0: int = 0) -> None:
    """Rows q_row0.. of out [rows, n_head * head_dim] = attention of the n query rows q_row0.. of q, at
    positions pos0.., over cache rows [0, pos0 + n). scores: scratch of n * n_head * (pos0 + n) floats."""
    pipeline = gpu.pipeline(f"attention_{kv_dtype}", shader(f"kv_{kv_dtype}") + shader("attention"))
    params = _params(n_head, n_head // kv_heads, head_dim, kv_heads, pos0, window, q_row0, pos0 + n,
                     np.float32(scale))
    gpu.dispatch(pipeline, params, [q, k_cache, v_cache, scores, out], (n_head, n, 1))
