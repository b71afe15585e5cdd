"""CpuBackend: the Numba kernels of this package behind the seam of kernels.backend.

Activations are NumPy float32 arrays; a weight is its GGUF bytes (a view of the file's mmap); the KV store
is one preallocated NumPy array per layer for K and one for V. Row-wise forwards of models whose weights
all have native kernels run their layers' stack in one kernel call (kernels.cpu.row_stack).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from kernels.backend import (
    OPS, Q8_0_BLOCK, Q8_0_BLOCK_BYTES, AttentionShape, AttentionSpec, DeltaNetSpec, GatedMlpSpec, LatentAttentionSpec,
    LayerSpec, MoeFfnSpec, MoeSpec, Segment,
)
from kernels.common import gguf_weights, kv_rows, q8_0
from kernels.common.state_store import HostStateStore
from kernels.cpu import moe, ops, quant, quant_dot
from kernels.cpu.delta_net import delta_net_rows
from kernels.cpu.attention import attention_prefill, decode_rows
from kernels.cpu.latent_attention import latent_attention
from kernels.cpu.resident import resident
from kernels.cpu.row_stack import ExpertsFfn, Layer as KernelLayer, Mlp, RowArgs, forward_rows
from kernels.cpu.row_variants import RowVariants
from kernels.cpu.typed_lists import typed_list

_ACTIVATIONS = {"silu": ops.SILU, "gelu": ops.GELU}


@dataclass(frozen=True)
class CpuWeight:
    qtype: int
    raw: np.ndarray  # uint8 [out_dim, row_bytes]
    out_dim: int
    in_dim: int
    bias: np.ndarray | None


_NO_SINKS = np.zeros(0, np.float32)


class CpuKvStore:
    """Per layer, K and V as [capacity, kv_heads, width] arrays: f16 bit patterns (uint16) or q8_0 blocks."""

    def __init__(self, kv_heads: Sequence[int], head_dims: Sequence[int], capacity: int, dtype: str,
                 value_is_key: Sequence[bool] | None = None):
        self.dtype = dtype
        self.k = [self._alloc(capacity, h, d) for h, d in zip(kv_heads, head_dims)]
        shared = value_is_key or [False] * len(self.k)
        # a layer whose V rows are its K rows holds one array for both (writes of V write the same rows)
        self.v = [k if same else self._alloc(capacity, h, d)
                  for k, same, h, d in zip(self.k, shared, kv_heads, head_dims)]
        self._views = {}  # per run of layers, its arrays as the row-wise kernel takes them, built on first use

    def _alloc(self, capacity: int, kv_heads: int, head_dim: int) -> np.ndarray:
        if self.dtype == "f16":
            return np.zeros((capacity, kv_heads, head_dim), dtype=np.uint16)
        return np.zeros((capacity, kv_heads, head_dim // Q8_0_BLOCK * Q8_0_BLOCK_BYTES), dtype=np.uint8)

    def row_layout(self, layer: int):
        return self.k[layer].dtype, self.k[layer].shape[1:]

    def decode(self, stored: np.ndarray) -> np.ndarray:
        if self.dtype == "f16":
            return ops.widen_f16(stored)
        return q8_0.dequantize(stored)

    def write_f32(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        self.write(layer, start, kv_rows.encode(self.dtype, k), kv_rows.encode(self.dtype, v))

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        self.k[layer][start : start + len(k)] = k
        self.v[layer][start : start + len(v)] = v

    def read(self, layer: int, start: int, end: int):
        return self.k[layer][start:end], self.v[layer][start:end]

    def copy_from(self, src: "CpuKvStore", start: int, end: int) -> None:
        for dst_l, src_l in zip(self.k + self.v, src.k + src.v):
            dst_l[start:end] = src_l[start:end]

    def nbytes(self) -> int:
        return sum(a.nbytes for a in {id(a): a for a in self.k + self.v}.values())

    def kernel_views(self, first: int, end: int) -> tuple:
        """Layers [first, end)'s K and V arrays as typed lists (what the row-wise kernel takes)."""
        views = self._views.get((first, end))
        if views is None:
            views = self._views[first, end] = (typed_list(self.k[first:end]), typed_list(self.v[first:end]))
        return views


class CpuRowStack:
    """A run of layers row-wise in one kernel call (kernels.cpu.row_stack.forward_rows), compiled first for
    one row and for many rows after (kernels.cpu.row_variants)."""

    def __init__(self, layers: list, first_layer: int):
        self.layers = typed_list(layers)
        self.n_embd = layers[0].attn_norm.shape[0]
        self.cache_layers = (first_layer, first_layer + len(layers))  # the KV rows of these layers
        groups = [(k.qkv_types, k.out_types, *_ffn_types(k.ffn)) for k in layers]
        # the kernel compiles for these formats only
        self.variants = RowVariants(forward_rows, np.concatenate(sum(groups, ())))

    def forward(self, x: np.ndarray, segments: Sequence[Segment]) -> None:
        slots = np.empty(x.shape[0], np.int64)
        positions = np.empty(x.shape[0], np.int64)
        if len(segments) == 1:
            kcs, vcs = segments[0].store.kernel_views(*self.cache_layers)
        else:
            first, end = self.cache_layers
            kcs = typed_list(a for s in segments for a in s.store.k[first:end])
            vcs = typed_list(a for s in segments for a in s.store.v[first:end])
        for slot, s in enumerate(segments):
            slots[s.row_start : s.row_end] = slot
            positions[s.row_start : s.row_end] = np.arange(s.pos0, s.pos0 + (s.row_end - s.row_start))
        args = self._args(x, kcs, vcs, slots, positions)
        forward_rows(self.variants.formats_for(x.shape[0], args), *args)

    def rows_ready(self, store: CpuKvStore, wait: bool = False) -> bool:
        rows = np.empty(2, np.int64)  # stand-ins of the types a call of two rows over `store` passes
        x = np.empty((2, self.n_embd), np.float32)
        return self.variants.ready(self._args(x, *store.kernel_views(*self.cache_layers), rows, rows), wait)

    def _args(self, x, kcs, vcs, slots, positions) -> RowArgs:
        return RowArgs(x=x, layers=self.layers, k_caches=kcs, v_caches=vcs, slots=slots,
                                 positions=positions, threads=quant.threads())


class CpuBackend:
    name = "cpu"

    def supports(self, qtype: int) -> bool:
        return gguf_weights.supports(qtype)  # the generic path takes whatever gguf.quants can dequantize

    def native(self, qtype: int) -> bool:
        return quant.has_native_kernel(qtype)

    def supports_op(self, op: str) -> bool:
        return op in OPS  # every op of the seam

    def upload_weight(self, qtype, raw, out_dim, in_dim, bias=None, mapped=False) -> CpuWeight:
        return CpuWeight(qtype, raw if mapped else resident(raw), out_dim, in_dim, bias)

    def upload_vector(self, v: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(v, dtype=np.float32)

    def kv_store(self, kv_heads, head_dims, capacity, dtype, value_is_key=None) -> CpuKvStore:
        return CpuKvStore(kv_heads, head_dims, capacity, dtype, value_is_key)

    def state_store(self, shapes) -> HostStateStore:
        return HostStateStore(shapes)

    def embed(self, w: CpuWeight, ids: np.ndarray, scale: float) -> np.ndarray:
        x = quant.gather_rows(w.qtype, w.raw, np.asarray(ids, dtype=np.int64))
        if scale != 1.0:
            x *= np.float32(scale)
        return x

    def linear(self, ws: Sequence[CpuWeight], x: np.ndarray, row_wise: bool) -> list[np.ndarray]:
        ys = [_product(row_wise)(w.qtype, w.raw, x) for w in ws]
        for w, y in zip(ws, ys):
            if w.bias is not None:
                y += w.bias
        return ys

    def rmsnorm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        n = x.shape[0]
        return ops.rmsnorm(x.reshape(n, -1, w.shape[0]), w, eps).reshape(n, -1)

    def rope(self, x, positions, head_dim, n_rot, base, neox, scaling=None) -> None:
        ops.rope(x.reshape(x.shape[0], -1, head_dim), positions, n_rot, base, neox, scaling)

    def gated(self, activation: str, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        if gate.shape != up.shape:  # one gate per row
            gate = np.broadcast_to(gate, up.shape)
        return {"gelu": ops.gelu_mul, "sigmoid": ops.sigmoid_mul}.get(activation, ops.silu_mul)(gate, up)

    def add(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return x + y

    def scale(self, x: np.ndarray, factor: float) -> np.ndarray:
        return x * np.float32(factor)

    def delta_net(self, spec: DeltaNetSpec, mixed, alpha, beta, segments: Sequence[Segment], layer: int):
        parts = []
        for s in segments:
            rows = slice(s.row_start, s.row_end)
            state = s.state
            parts.append(delta_net_rows(mixed[rows], alpha[rows], beta[rows], spec.dt_bias, spec.a, spec.conv_w,
                                        spec.n_k, spec.head, spec.eps, state.conv[layer], state.ssm[layer],
                                        state.row_buffers(layer, s.row_end - s.row_start)))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def attention(self, q, k, v, segments: Sequence[Segment], layer: int, shape: AttentionShape,
                  row_wise: bool) -> np.ndarray:
        n, hd = q.shape[0], shape.head_dim
        q3 = q.reshape(n, shape.n_head, hd)
        out = np.empty_like(q3)
        for s in segments:
            r0, r1, store = s.row_start, s.row_end, s.store
            if k is not None:  # else another layer's rows, written earlier in this forward
                kv_rows = (n, shape.n_kv, hd)
                store.write_f32(layer, s.pos0, k.reshape(kv_rows)[r0:r1], v.reshape(kv_rows)[r0:r1])
            n_keys = s.pos0 + (r1 - r0)
            keys, values = store.read(layer, 0, n_keys)
            if row_wise and store.dtype == "f16":  # each row over the keys up to its own, read as f16 bits
                sinks = _NO_SINKS if shape.sinks is None else shape.sinks
                decode_rows(np.ascontiguousarray(q3[r0:r1]), keys, values, np.arange(s.pos0 + 1, n_keys + 1),
                            shape.window, np.float32(shape.scale), sinks, out[r0:r1])
                continue
            keys = store.decode(keys)
            values = keys if store.v[layer] is store.k[layer] else store.decode(values)  # latent rows: once
            # row-wise: each row attends as a one-row prefill would, over the keys up to its own position
            spans = [(r, r + 1) for r in range(r0, r1)] if row_wise else [(r0, r1)]
            for a, b in spans:
                pos0 = s.pos0 + (a - r0)
                out[a:b] = attention_prefill(q3[a:b], keys[: pos0 + b - a], values[: pos0 + b - a], pos0,
                                             shape.window, shape.scale, threads=quant.threads(), sinks=shape.sinks)
        return out.reshape(n, -1)

    def latent_attention(self, spec: LatentAttentionSpec, q, kv, segments: Sequence[Segment], positions: np.ndarray,
                         layer: int, row_wise: bool) -> np.ndarray:
        return latent_attention(self, spec, q, kv, segments, positions, layer, row_wise)

    def take_rows(self, x: np.ndarray, rows: Sequence[int]) -> np.ndarray:
        return x[list(rows)]

    def moe_ffn(self, spec: MoeSpec, x: np.ndarray, router_logits: np.ndarray, row_wise: bool) -> np.ndarray:
        return moe.moe_ffn(spec, x, router_logits, row_wise)

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return x

    def row_stack(self, layers: Sequence[LayerSpec], first_layer: int = 0) -> CpuRowStack | None:
        kernel_layers = [_kernel_layer(spec) for spec in layers]
        if not kernel_layers or any(k is None for k in kernel_layers):
            return None
        return CpuRowStack(kernel_layers, first_layer)


def _product(row_wise: bool):
    """The weight product of each path: row-wise (every row its one-row bits) or prefill."""
    return quant.rows if row_wise else quant.matmul


def _kernel_layer(spec: LayerSpec) -> KernelLayer | None:
    """A layer as the row-wise kernel reads it, or None when a part is of a kind it does not know or a
    weight has no native kernel."""
    attn = spec.mixer
    ffn = _kernel_ffn(spec.feed_forward)
    if not isinstance(attn, AttentionSpec) or ffn is None:
        return None
    if not all(quant.has_native_kernel(p.qtype) for p in (*attn.qkv, attn.out)):
        return None
    (qkv, qkv_types), (out, out_types) = _stacked(attn.qkv), _stacked([attn.out])
    q_bias, k_bias, v_bias = (p.bias for p in attn.qkv)
    a = attn.shape
    return KernelLayer(
        qkv=qkv, qkv_types=qkv_types, out=out, out_types=out_types, ffn=ffn,
        attn_norm=spec.attn_norm, ffn_norm=spec.ffn_norm, post_attn_norm=_vector(spec.post_attn_norm),
        post_ffn_norm=_vector(spec.post_ffn_norm), q_norm=_vector(attn.q_norm), k_norm=_vector(attn.k_norm),
        q_bias=_vector(q_bias), k_bias=_vector(k_bias), v_bias=_vector(v_bias), out_bias=_vector(attn.out.bias),
        sinks=_vector(a.sinks), n_head=a.n_head, n_kv=a.n_kv, head_dim=a.head_dim, rope_dims=attn.rope_dims,
        rope_neox=bool(attn.rope_neox), rope_base=float(attn.rope_base), **_rope_scaling(attn), window=int(a.window),
        eps=float(spec.eps), attn_scale=float(a.scale))


def _rope_scaling(attn: AttentionSpec) -> dict:
    """The kernel layer's scaled-RoPE fields: an unscaled layer leaves the frequencies to its rope_base."""
    if attn.rope_scaling is None:
        return dict(rope_inv=np.zeros(0, np.float64), rope_magnitude=1.0)
    return dict(rope_inv=ops.scaled_frequencies(attn.rope_dims, attn.rope_base, attn.rope_scaling),
                rope_magnitude=attn.rope_scaling.magnitude())


def _kernel_ffn(spec) -> Mlp | ExpertsFfn | None:
    """A feed-forward as the row-wise kernel reads it, or None (a kind it does not know, a weight with no
    native kernel)."""
    if isinstance(spec, GatedMlpSpec):
        parts = [*spec.gate_up, spec.down]
    elif isinstance(spec, MoeFfnSpec):
        parts = [spec.router, spec.experts.gate, spec.experts.up, spec.experts.down]
    else:
        return None
    if not all(quant.has_native_kernel(p.qtype) for p in parts):
        return None
    if isinstance(spec, GatedMlpSpec):
        (gate_up, gate_up_types), (down, down_types) = _stacked(spec.gate_up), _stacked([spec.down])
        return Mlp(gate_up=gate_up, gate_up_types=gate_up_types, down=down, down_types=down_types,
                   activation=_ACTIVATIONS[spec.activation])
    router, router_types = _stacked([spec.router])
    return ExpertsFfn(router=router, router_types=router_types, router_bias=_vector(spec.router.bias),
                      experts=moe.kernel_experts(spec.experts))


def _ffn_types(ffn: Mlp | ExpertsFfn) -> tuple[np.ndarray, ...]:
    """The GGML types of a kernel feed-forward's weights."""
    if isinstance(ffn, Mlp):
        return ffn.gate_up_types, ffn.down_types
    return ffn.router_types, ffn.experts.types


def _stacked(parts):
    """Weights as one product of the row-wise kernel takes them: (weights, their types)."""
    qtypes, ws = quant_dot.stack([p.qtype for p in parts], [quant.kernel_weight(p.qtype, p.raw) for p in parts])
    return ws, qtypes


def _vector(v):
    return np.zeros(0, np.float32) if v is None else v


def create_backend() -> CpuBackend:
    return CpuBackend()


def device_present() -> bool:
    return True
