"""CudaBackend: the ops of kernels.backend as numba-cuda kernels, weights and the KV cache (f16 or q8_0) in
device memory.

A forward moves the token ids and positions to the device and the logits (or the hidden states) back;
everything in between stays there. Formats without a CUDA kernel are widened to F32 once, at upload.
What real hardware would add (not done: tested under the simulator only): one launch per fused linear
group, a block-parallel attention, per-layer fusion of norm/RoPE/cache write, and a CUDA graph per
decode step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from kernels.backend import (
    OP_ATTENTION_SHARED, OP_ATTENTION_SINKS, OP_DELTA_NET, OP_GATED_SIGMOID, OP_LATENT_ATTENTION, OP_MOE_FFN,
    OP_MOE_STREAMED, OP_ROPE_SCALED, OP_SCALE, OPS,
    Q8_0_BLOCK, Q8_0_BLOCK_BYTES,
    AttentionShape, BackendUnavailable, Segment,
)
from kernels.common import gguf_weights, kv_rows
from kernels.cuda import kernels as k
from kernels.cuda.formats import DECODERS, FLOAT_VIEWS

try:
    from numba import cuda
except ImportError as e:  # numba without numba-cuda (the optional `cuda` extra)
    raise ImportError(f"numba-cuda is not installed ({e})") from None

_PREFILL_TILED_ROWS = 4  # prefill products over more rows than this use the tiled kernel


@dataclass(frozen=True)
class CudaWeight:
    qtype: int  # what the device holds (F32 for a format widened at upload)
    out_dim: int
    in_dim: int
    data: object  # device array in the format's view (kernels.cuda.formats)
    bias: object  # device float32 [out_dim] (zeros when the weight has none)


class DeviceRows(NamedTuple):
    """One layer's K (or V) in device memory, as the cache kernels take them: values, then scales."""

    values: object
    scales: object


class CudaKvStore:
    """Per layer, K and V in device memory: f16 as float16 [capacity, kv_heads, head_dim]; q8_0 as int8
    values [capacity, kv_heads, head_dim] and float16 scales [capacity, kv_heads, head_dim / 32], which
    read and write interleave into GGML's block_q8_0 bytes."""

    def __init__(self, kv_heads: Sequence[int], head_dims: Sequence[int], capacity: int, dtype: str):
        self.dtype, self.capacity = dtype, capacity
        values = np.float16 if dtype == "f16" else np.int8
        # per layer, K then V, each DeviceRows; an f16 cache passes its values as the unused scales
        self.layers = [[self._alloc(capacity, h, d, values) for _ in "kv"] for h, d in zip(kv_heads, head_dims)]
        self.widths = [d if dtype == "f16" else d // Q8_0_BLOCK * Q8_0_BLOCK_BYTES for d in head_dims]

    def _alloc(self, capacity: int, heads: int, head_dim: int, values) -> "DeviceRows":
        v = cuda.to_device(np.zeros((capacity, heads, head_dim), values))
        if self.dtype == "f16":
            return DeviceRows(v, v)
        return DeviceRows(v, cuda.to_device(np.zeros((capacity, heads, head_dim // Q8_0_BLOCK), np.float16)))

    def row_layout(self, layer: int):
        dtype = np.uint16 if self.dtype == "f16" else np.uint8
        return np.dtype(dtype), (self.layers[layer][0][0].shape[1], self.widths[layer])

    def write_f32(self, layer: int, start: int, k_rows: np.ndarray, v_rows: np.ndarray) -> None:
        self.write(layer, start, kv_rows.encode(self.dtype, k_rows), kv_rows.encode(self.dtype, v_rows))

    def write(self, layer: int, start: int, k_rows: np.ndarray, v_rows: np.ndarray) -> None:
        for (values, scales), rows in zip(self.layers[layer], (k_rows, v_rows)):
            if not len(rows):
                continue
            end = start + len(rows)
            if self.dtype == "f16":
                values[start:end].copy_to_device(np.ascontiguousarray(rows).view(np.float16))
                continue
            blocks = np.ascontiguousarray(rows).reshape(*rows.shape[:2], -1, Q8_0_BLOCK_BYTES)
            values[start:end].copy_to_device(np.ascontiguousarray(blocks[..., 2:]).view(np.int8)
                                             .reshape(len(rows), *values.shape[1:]))
            scales[start:end].copy_to_device(np.ascontiguousarray(blocks[..., :2]).view(np.float16)[..., 0])

    def read(self, layer: int, start: int, end: int):
        dtype, shape = self.row_layout(layer)
        if end <= start:
            return np.zeros((0, *shape), dtype), np.zeros((0, *shape), dtype)
        out = []
        for values, scales in self.layers[layer]:
            if self.dtype == "f16":
                out.append(values[start:end].copy_to_host().view(np.uint16))
                continue
            q = values[start:end].copy_to_host().view(np.uint8).reshape(end - start, shape[0], -1, Q8_0_BLOCK)
            d = scales[start:end].copy_to_host().view(np.uint8).reshape(end - start, shape[0], -1, 2)
            out.append(np.concatenate([d, q], axis=-1).reshape(end - start, *shape))
        return out[0], out[1]

    def copy_from(self, src: "CudaKvStore", start: int, end: int) -> None:
        if end <= start:
            return
        for dst_layer, src_layer in zip(self.layers, src.layers):
            for (dst_values, dst_scales), (src_values, src_scales) in zip(dst_layer, src_layer):
                dst_values[start:end].copy_to_device(src_values[start:end])
                if self.dtype != "f16":
                    dst_scales[start:end].copy_to_device(src_scales[start:end])

    def nbytes(self) -> int:  # what the device holds, the storage form's size (q8_0 scales included)
        total = 0
        for layer in range(len(self.layers)):
            dtype, (heads, width) = self.row_layout(layer)
            total += 2 * self.capacity * heads * width * dtype.itemsize
        return total


def _blocks(cols: int, per: int) -> int:
    return max(1, min(math.ceil(cols / per), 64))


class CudaBackend:
    name = "cuda"

    def __init__(self):
        self._positions = (None, None)  # the last positions uploaded (host, device): every layer reuses them

    def supports(self, qtype: int) -> bool:
        return qtype in DECODERS or gguf_weights.supports(qtype)  # the others widened on the host

    def native(self, qtype: int) -> bool:
        return qtype in DECODERS

    def supports_op(self, op: str) -> bool:
        # every op of the seam but the experts', attention sinks, scaled RoPE, latent attention, the hybrids' and
        # Gemma 4's (no kernels yet)
        return op in OPS and op not in (OP_MOE_FFN, OP_ATTENTION_SINKS, OP_ROPE_SCALED, OP_LATENT_ATTENTION,
                                        OP_DELTA_NET, OP_GATED_SIGMOID, OP_ATTENTION_SHARED, OP_SCALE,
                                        OP_MOE_STREAMED)

    def upload_weight(self, qtype, raw, out_dim, in_dim, bias=None, mapped=False) -> CudaWeight:
        if qtype not in DECODERS:  # widened once on the host
            raw, qtype = gguf_weights.dequantize(qtype, raw), int(T.F32)
        view = FLOAT_VIEWS.get(qtype)
        data = np.asarray(raw) if view is None else np.asarray(raw).view(view).reshape(out_dim, in_dim)
        b = np.zeros(out_dim, np.float32) if bias is None else np.asarray(bias, np.float32)
        return CudaWeight(int(qtype), out_dim, in_dim, cuda.to_device(np.ascontiguousarray(data)), cuda.to_device(b))

    def upload_vector(self, v: np.ndarray):
        return cuda.to_device(np.ascontiguousarray(v, dtype=np.float32))

    def kv_store(self, kv_heads, head_dims, capacity, dtype, value_is_key=None) -> CudaKvStore:
        if any(value_is_key or ()):  # only latent attention caches so, and this backend does not run it
            raise ValueError("this backend keeps separate K and V rows in every layer")
        return CudaKvStore(kv_heads, head_dims, capacity, dtype)

    def embed(self, w: CudaWeight, ids: np.ndarray, scale: float):
        out = cuda.device_array((len(ids), w.in_dim), np.float32)
        if len(ids):
            k.products(w.qtype).gather[len(ids), k.ELEMENTS](w.data, cuda.to_device(np.asarray(ids, np.int64)),
                                                             np.float32(scale), out)
        return out

    def linear(self, ws: Sequence[CudaWeight], x, row_wise: bool) -> list:
        n = x.shape[0]
        ys = []
        for w in ws:
            y = cuda.device_array((n, w.out_dim), np.float32)
            kernels = k.products(w.qtype)
            if n == 0:
                pass
            elif row_wise or n <= _PREFILL_TILED_ROWS:
                kernels.matvec[(math.ceil(w.out_dim / k.THREADS), n), (k.THREADS, 1)](w.data, x, w.bias, y)
            else:
                grid = (math.ceil(w.out_dim / k.TILE), math.ceil(n / k.TILE))
                kernels.matmul[grid, (k.TILE, k.TILE)](w.data, x, w.bias, y)
            ys.append(y)
        return ys

    def rmsnorm(self, x, w, eps: float):
        out = cuda.device_array(x.shape, np.float32)
        if x.shape[0]:
            runs = x.shape[1] // w.shape[0]
            k.rmsnorm[(math.ceil(runs / k.THREADS), x.shape[0]), (k.THREADS, 1)](x, w, np.float32(eps), out)
        return out

    def _device_positions(self, positions: np.ndarray):
        host, device = self._positions
        if host is None or not np.array_equal(host, positions):
            host = np.asarray(positions, np.int64).copy()
            self._positions = host, cuda.to_device(host)
        return self._positions[1]

    def rope(self, x, positions, head_dim, n_rot, base, neox, scaling=None) -> None:  # scaling: refused
        if x.shape[0]:
            k.rope[(x.shape[0], x.shape[1] // head_dim), k.THREADS](
                x, self._device_positions(positions), head_dim, n_rot, float(base), bool(neox))

    def _elementwise(self, kernel, *args):
        a = args[-1]
        out = cuda.device_array(a.shape, np.float32)
        if a.shape[0]:
            kernel[(a.shape[0], _blocks(a.shape[1], k.ELEMENTS)), k.ELEMENTS](*args, out)
        return out

    def gated(self, activation: str, gate, up):
        return self._elementwise(k.gated, activation == "gelu", gate, up)

    def add(self, x, y):
        return self._elementwise(k.add, x, y)

    def attention(self, q, key, value, segments: Sequence[Segment], layer: int, shape: AttentionShape,
                  row_wise: bool):
        out = cuda.device_array(q.shape, np.float32)
        for s in segments:
            r0, r1 = s.row_start, s.row_end
            kv_write, attend = k.cache_kernels(s.store.dtype == "q8_0")
            keys, values = s.store.layers[layer]
            kv_write[r1 - r0, shape.n_kv](key[r0:r1], value[r0:r1], *keys, *values, s.pos0)
            attend[r1 - r0, shape.n_head](q[r0:r1], *keys, *values, s.pos0, shape.window, np.float32(shape.scale),
                                          out[r0:r1])
        return out

    def take_rows(self, x, rows: Sequence[int]):
        out = cuda.device_array((len(rows), x.shape[1]), np.float32)
        k.take_rows[len(rows), k.ELEMENTS](x, cuda.to_device(np.asarray(rows, np.int64)), out)
        return out

    def to_host(self, x) -> np.ndarray:
        return x.copy_to_host()

    def row_stack(self, layers, first_layer=0):
        return None  # the engine composes the row-wise ops; each of them is row-independent here


def device_present() -> bool:
    try:
        return bool(cuda.is_available())
    except Exception:  # a broken driver install reads as no device; create_backend says why
        return False


def create_backend() -> CudaBackend:
    try:
        if not cuda.is_available():
            raise BackendUnavailable("no CUDA device or driver was found")
        cuda.current_context()
    except BackendUnavailable:
        raise
    except Exception as e:
        raise BackendUnavailable(f"the CUDA driver failed to start ({e})") from None
    return CudaBackend()
