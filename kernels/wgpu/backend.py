"""GpuBackend: the WGSL kernels of kernels.wgpu.ops behind the seam of kernels.backend.

Activations are f32 device buffers; weights their GGUF bytes uploaded once (types without a shader are
widened to F32 once at upload); each cache's K/V rows stay in device memory: f16 as the very bytes of the
storage form, q8_0 as the f32 values of its blocks (rebuilt into block bytes on read). Every kernel computes
a row on its own, so the prefill and row-wise paths are one path here and row_stack is left to the engine.
Dispatches queue up and run when a result is read back (to_host, a KV read).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from kernels.backend import (
    OP_ATTENTION_SHARED, OP_ATTENTION_SINKS, OP_DELTA_NET, OP_GATED_SIGMOID, OP_LATENT_ATTENTION, OP_MOE_FFN,
    OP_MOE_STREAMED, OP_ROPE_SCALED, OP_SCALE, OPS,
    Q8_0_BLOCK, Q8_0_BLOCK_BYTES,
    AttentionShape, BackendUnavailable, Segment, kv_rows_f32,
)
from kernels.common import gguf_weights, kv_rows, q8_0
from kernels.wgpu import ops
from kernels.wgpu.device import Gpu, GpuUnavailable, gpu

_ACTIVATIONS = {"silu": ops.SILU, "gelu": ops.GELU}
# attention scores of one dispatch: 64 MB holds a 512-row prefill of 16 heads over 2k keys; longer contexts
# take fewer rows a dispatch
_SCRATCH_BYTES = 64 << 20
_ROPE_POSITIONS = 4096  # a RoPE table covers at least this many positions, doubling when a row goes past


@dataclass
class GpuAct:
    """A float32 [rows, cols] matrix in a device buffer."""

    buffer: object
    rows: int
    cols: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.cols


@dataclass(frozen=True)
class GpuWeight:
    qtype: int  # the file's type (the resident copy may be widened)
    out_dim: int
    in_dim: int
    resident: ops.Weight
    bias: object | None


@dataclass(frozen=True)
class GpuVector:
    buffer: object
    n: int


class GpuKvStore:
    """Per layer, one device buffer for K and one for V, [capacity, kv_heads, head_dim]: f16 bit patterns
    (the storage form itself) or, for q8_0, the f32 values of the blocks."""

    def __init__(self, device: Gpu, kv_heads: Sequence[int], head_dims: Sequence[int], capacity: int, dtype: str):
        self.dtype = dtype
        self.device_dtype = "f16" if dtype == "f16" else "f32"  # what the attention shaders read
        self._gpu = device
        self._item = 2 if dtype == "f16" else 4
        self.kv_heads, self.head_dims = tuple(kv_heads), tuple(head_dims)
        sizes = [capacity * h * d * self._item for h, d in zip(kv_heads, head_dims)]
        self.k = [device.empty(n) for n in sizes]
        self.v = [device.empty(n) for n in sizes]
        self._nbytes = 2 * sum(sizes)

    def width(self, layer: int) -> int:
        return self.kv_heads[layer] * self.head_dims[layer]

    def row_layout(self, layer: int):
        h, d = self.kv_heads[layer], self.head_dims[layer]
        if self.dtype == "f16":
            return np.dtype(np.uint16), (h, d)
        return np.dtype(np.uint8), (h, d // Q8_0_BLOCK * Q8_0_BLOCK_BYTES)

    def write_f32(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        self.write(layer, start, kv_rows.encode(self.dtype, k), kv_rows.encode(self.dtype, v))

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        offset = start * self.width(layer) * self._item
        for buf, rows in ((self.k[layer], k), (self.v[layer], v)):
            if len(rows):
                self._gpu.write(buf, rows if self.dtype == "f16" else kv_rows_f32(self.dtype, rows), offset)

    def read(self, layer: int, start: int, end: int):
        h, d = self.kv_heads[layer], self.head_dims[layer]
        offset = start * self.width(layer) * self._item
        dtype = np.uint16 if self.dtype == "f16" else np.float32
        k, v = (self._gpu.read(buf, dtype, (end - start, h, d), offset) for buf in (self.k[layer], self.v[layer]))
        if self.dtype == "f16":
            return k, v
        return q8_0.quantize(k), q8_0.quantize(v)

    def copy_from(self, src: "GpuKvStore", start: int, end: int) -> None:
        for layer in range(len(self.k)):
            row = self.width(layer) * self._item
            for dst_buf, src_buf in ((self.k[layer], src.k[layer]), (self.v[layer], src.v[layer])):
                if end > start:
                    self._gpu.copy(src_buf, start * row, dst_buf, start * row, (end - start) * row)

    def nbytes(self) -> int:
        return self._nbytes


class GpuBackend:
    name = "gpu"

    def __init__(self, device: Gpu):
        self.gpu = device
        self.device_name = device.name
        self._rope_tables: dict[tuple[int, float], tuple[int, object]] = {}
        self._scores = None
        self._scratch_floats = min(device.max_binding, _SCRATCH_BYTES) // 4

    # -- resident data

    def supports(self, qtype: int) -> bool:
        return ops.supports(qtype) or gguf_weights.supports(qtype)

    def native(self, qtype: int) -> bool:
        return ops.supports(qtype)

    def supports_op(self, op: str) -> bool:
        # every op of the seam but the experts', attention sinks, scaled RoPE, latent attention, the hybrids' and
        # Gemma 4's (no kernels yet)
        return op in OPS and op not in (OP_MOE_FFN, OP_ATTENTION_SINKS, OP_ROPE_SCALED, OP_LATENT_ATTENTION,
                                        OP_DELTA_NET, OP_GATED_SIGMOID, OP_ATTENTION_SHARED, OP_SCALE,
                                        OP_MOE_STREAMED)

    def upload_weight(self, qtype, raw, out_dim, in_dim, bias=None, mapped=False) -> GpuWeight:
        if ops.supports(qtype):
            resident = ops.upload_weight(self.gpu, qtype, raw)
        else:  # no shader reads it: widened once (exact, at 4 bytes a weight)
            resident = ops.upload_weight(self.gpu, T.F32, gguf_weights.dequantize(qtype, raw).view(np.uint8))
        return GpuWeight(qtype, out_dim, in_dim, resident, None if bias is None else self.gpu.upload(
            np.ascontiguousarray(bias, np.float32)))

    def upload_vector(self, v: np.ndarray) -> GpuVector:
        return GpuVector(self.gpu.upload(np.ascontiguousarray(v, np.float32)), len(v))

    def kv_store(self, kv_heads, head_dims, capacity, dtype, value_is_key=None) -> GpuKvStore:
        if any(value_is_key or ()):  # only latent attention caches so, and this backend does not run it
            raise ValueError("this backend keeps separate K and V rows in every layer")
        return GpuKvStore(self.gpu, kv_heads, head_dims, capacity, dtype)

    # -- ops on activations

    def _act(self, rows: int, cols: int) -> GpuAct:
        return GpuAct(self.gpu.empty(rows * cols * 4), rows, cols)

    def embed(self, w: GpuWeight, ids: np.ndarray, scale: float) -> GpuAct:
        out = self._act(len(ids), w.in_dim)
        if len(ids):
            ops.get_rows(self.gpu, w.resident, self.gpu.upload(np.asarray(ids, np.uint32)), len(ids), out.buffer,
                         scale)
        return out

    def linear(self, ws: Sequence[GpuWeight], x: GpuAct, row_wise: bool) -> list[GpuAct]:
        ys = []
        for w in ws:
            y = self._act(x.rows, w.out_dim)
            if x.rows:
                ops.matmul(self.gpu, w.resident, x.buffer, x.rows, y.buffer, bias=w.bias)
            ys.append(y)
        return ys

    def rmsnorm(self, x: GpuAct, w: GpuVector, eps: float) -> GpuAct:
        out = self._act(x.rows, x.cols)
        if x.rows:
            ops.rmsnorm(self.gpu, x.buffer, w.buffer, out.buffer, w.n, x.rows, eps, heads=x.cols // w.n)
        return out

    def rope(self, x: GpuAct, positions: np.ndarray, head_dim: int, n_rot: int, base: float, neox: bool,
             scaling=None) -> None:  # scaling: refused (supports_op)
        if not x.rows:
            return
        positions = np.asarray(positions, np.int64)
        table = self._rope_table(n_rot, float(base), int(positions.max()) + 1)
        ops.rope(self.gpu, x.buffer, table, self.gpu.upload(positions.astype(np.uint32)), x.rows,
                 x.cols // head_dim, head_dim, n_rot, neox)

    def _rope_table(self, n_rot: int, base: float, positions: int):
        size, table = self._rope_tables.get((n_rot, base), (0, None))
        if size < positions:
            size = max(_ROPE_POSITIONS, 1 << (positions - 1).bit_length())
            table = ops.rope_table(self.gpu, n_rot, base, size)
            self._rope_tables[(n_rot, base)] = (size, table)
        return table

    def gated(self, activation: str, gate: GpuAct, up: GpuAct) -> GpuAct:
        out = self._act(gate.rows, gate.cols)
        if gate.rows:
            ops.gated(self.gpu, gate.buffer, up.buffer, out.buffer, gate.rows * gate.cols, _ACTIVATIONS[activation])
        return out

    def add(self, x: GpuAct, y: GpuAct) -> GpuAct:
        out = self._act(x.rows, x.cols)
        if x.rows:
            ops.add(self.gpu, x.buffer, y.buffer, out.buffer, x.rows * x.cols)
        return out

    def attention(self, q: GpuAct, k: GpuAct, v: GpuAct, segments: Sequence[Segment], layer: int,
                  shape: AttentionShape, row_wise: bool) -> GpuAct:
        out = self._act(q.rows, q.cols)
        width = shape.n_kv * shape.head_dim
        for s in segments:
            n, store = s.row_end - s.row_start, s.store
            if not n:
                continue
            ops.kv_store(self.gpu, store.dtype, k.buffer, v.buffer, store.k[layer], store.v[layer], n, width,
                         s.pos0, src_row0=s.row_start)
            # query rows in runs whose scores fit the scratch (each row attends on its own, so runs are exact)
            run = max(1, self._scratch_floats // (shape.n_head * (s.pos0 + n)))
            for a in range(0, n, run):
                b = min(n, a + run)
                ops.attention(self.gpu, store.device_dtype, q.buffer, store.k[layer], store.v[layer],
                              self._scratch(), out.buffer, b - a, shape.n_head, shape.n_kv, shape.head_dim,
                              s.pos0 + a, shape.window, shape.scale, q_row0=s.row_start + a)
        return out

    def _scratch(self):
        """The attention scores' scratch, made on first use (queued dispatches use it one after another)."""
        if self._scores is None:
            self._scores = self.gpu.empty(self._scratch_floats * 4)
        return self._scores

    def take_rows(self, x: GpuAct, rows: Sequence[int]) -> GpuAct:
        out = self._act(len(rows), x.cols)
        row = x.cols * 4
        for i, r in enumerate(rows):
            self.gpu.copy(x.buffer, r * row, out.buffer, i * row, row)
        return out

    def to_host(self, x: GpuAct) -> np.ndarray:
        if not x.rows:
            return np.empty((0, x.cols), np.float32)
        return self.gpu.read(x.buffer, np.float32, (x.rows, x.cols))

    def row_stack(self, layers, first_layer=0) -> None:
        return None  # the composed ops are already row-wise on the device


def create_backend() -> GpuBackend:
    try:
        return GpuBackend(gpu())
    except GpuUnavailable as e:
        raise BackendUnavailable(str(e)) from None


def device_present() -> bool:
    """Whether wgpu finds an adapter (what "auto" asks on macOS, where it is Metal)."""
    try:
        gpu()
    except GpuUnavailable:
        return False
    return True
