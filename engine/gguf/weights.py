"""GGUF tensors bound as typed linear weights, kept in source precision (spec 13.2).

A `LinearWeight` is the tensor's raw GGUF bytes (a view of the file's mmap) plus
its GGML type, uploaded once to the model's backend (kernels.backend), whose kernels
read the blocks directly (in the file's pages, or in a copy the backend keeps in
memory of its own). Nothing is widened to f32 at load. A
`LinearGroup` holds several weights that share an input (q/k/v, gate/up); the
backend runs them as one pass. `load_experts` binds a stacked experts tensor as one weight, every expert's
rows in turn (the kernels read an expert's rows in place); `load_heads` a stacked per-head tensor as a weight
per head.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType

from engine.errors import UnsupportedWeightType, WeightShapeError
from engine.gguf.reader import GGUFFile, ggml_type_name
from kernels.backend import Backend, Weight
from kernels.common import gguf_weights

_FLOAT_VECTOR_TYPES = {0: np.float32, 1: np.float16}  # 1-D norms and biases


class LinearWeight:
    """y = x @ W.T for W [out, in] stored as GGUF blocks."""

    def __init__(self, name: str, qtype: int, raw: np.ndarray, out_dim: int, in_dim: int, backend: Backend,
                 bias: np.ndarray | None = None):
        self.name = name
        self.qtype = qtype
        self.raw = raw
        self.out_dim = out_dim
        self.in_dim = in_dim
        self.backend = backend
        self.handle: Weight = backend.upload_weight(qtype, raw, out_dim, in_dim, bias)

    @classmethod
    def load(cls, file: GGUFFile, name: str, out_dim: int, in_dim: int, backend: Backend,
             bias: str | None = None) -> "LinearWeight":
        """The tensor `name` (with the 1-D tensor `bias` added to its products, when named)."""
        info = _checked_tensor(file, name, (out_dim, in_dim), "(out, in)", backend)
        bias_values = None if bias is None else load_vector(file, bias, out_dim)
        return cls(name, info.ggml_type, file.raw(info), out_dim, in_dim, backend, bias_values)

    @classmethod
    def load_row(cls, file: GGUFFile, name: str, in_dim: int, backend: Backend) -> "LinearWeight":
        """A vector tensor [in_dim] as a one-row matrix: its product is one value per row (a scalar gate)."""
        info = _checked_tensor(file, name, (in_dim,), "(in)", backend)
        return cls(name, info.ggml_type, file.raw(info), 1, in_dim, backend)

    @classmethod
    def load_interleaved(cls, file: GGUFFile, name: str, parts: int, block: int, out_dim: int, in_dim: int,
                         backend: Backend) -> list["LinearWeight"]:
        """A tensor [out_dim, in_dim] whose rows interleave `parts` matrices in runs of `block` rows (Qwen3.5's
        query and output gate, per head) as `parts` weights [out_dim / parts, in_dim]: each row's products are
        those of the whole tensor's row."""
        info = _checked_tensor(file, name, (out_dim, in_dim), "(out, in)", backend)
        raw = file.raw(info)
        runs = raw.reshape(-1, parts, block, raw.shape[-1])
        return [cls(f"{name}[{i}]", info.ggml_type, np.ascontiguousarray(runs[:, i]).reshape(-1, raw.shape[-1]),
                    out_dim // parts, in_dim, backend) for i in range(parts)]

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.qtype)

    def __call__(self, x, row_wise: bool = False):
        """x [n, in] -> [n, out] as backend activations; row_wise: row i bitwise what x[i] alone gives,
        else the prefill product."""
        return self.backend.linear([self.handle], x, row_wise)[0]

    def rows(self, ids: np.ndarray, scale: float = 1.0):
        """Dequantized rows times scale (the embedding lookup), an activation [len(ids), in]."""
        return self.backend.embed(self.handle, np.asarray(ids, dtype=np.int64), scale)


class LinearGroup:
    """Weights applied to the same input (q/k/v, gate/up), one backend call for all of them."""

    def __init__(self, parts: list[LinearWeight]):
        self.parts = parts
        self.backend = parts[0].backend

    def __call__(self, x, row_wise: bool = False) -> list:
        return self.backend.linear([p.handle for p in self.parts], x, row_wise)


def load_experts(file: GGUFFile, name: str, n_expert: int, out_dim: int, in_dim: int, backend: Backend) -> Weight:
    """The stacked experts tensor `name` [n_expert, out_dim, in_dim] as one weight [n_expert * out_dim, in_dim]
    in its own format (expert e is rows [e * out_dim, (e + 1) * out_dim)): a view of the file's bytes, which
    the backend reads in place (a token reads few experts, and all of them may not fit memory)."""
    info = _checked_tensor(file, name, (n_expert, out_dim, in_dim), "(expert, out, in)", backend)
    return backend.upload_weight(info.ggml_type, file.raw(info), n_expert * out_dim, in_dim, mapped=True)


def load_heads(file: GGUFFile, name: str, n_head: int, out_dim: int, in_dim: int, backend: Backend) -> list[Weight]:
    """A tensor of one matrix per attention head [n_head, out_dim, in_dim] (MLA's attn_k_b, attn_v_b) as a
    weight per head, each a view of the file's bytes."""
    info = _checked_tensor(file, name, (n_head, out_dim, in_dim), "(head, out, in)", backend)
    raw = file.raw(info)
    return [backend.upload_weight(info.ggml_type, raw[h * out_dim : (h + 1) * out_dim], out_dim, in_dim)
            for h in range(n_head)]


def load_unsplit_kv_b(file: GGUFFile, name: str, n_head: int, nope: int, v_dim: int, rank: int,
                      backend: Backend) -> tuple[list[Weight], list[Weight]]:
    """An older MLA file's attn_kv_b [n_head * (nope + v_dim), rank] (each head's key rows, then its value rows)
    as the split form's per-head weights: k_b[head] [rank, nope], the head's key rows transposed (widened to
    F32 once, at load: the absorbed query needs them so; llama.cpp's converter does the same to the file),
    and v_b[head] [v_dim, rank], a view of its value rows."""
    info = _checked_tensor(file, name, (n_head * (nope + v_dim), rank), "(out, in)", backend)
    raw = file.raw(info)
    k_b, v_b = [], []
    for h in range(n_head):
        first = h * (nope + v_dim)
        key_rows = gguf_weights.dequantize(info.ggml_type, raw, first, first + nope)  # [nope, rank]
        transposed = np.ascontiguousarray(key_rows.T, np.float32)
        k_b.append(backend.upload_weight(GGMLQuantizationType.F32, transposed.view(np.uint8), rank, nope))
        v_b.append(backend.upload_weight(info.ggml_type, raw[first + nope : first + nope + v_dim], v_dim, rank))
    return k_b, v_b


def _checked_tensor(file: GGUFFile, name: str, shape: tuple[int, ...], axes: str, backend: Backend):
    """The tensor `name`, of this shape and a type the backend multiplies by."""
    info = file.tensor(name)
    if info.shape != shape:
        raise WeightShapeError(f"{file.path}: tensor {name!r} has shape {list(info.shape)}, expected "
                               f"{list(shape)} {axes}")
    if not backend.supports(info.ggml_type):
        raise UnsupportedWeightType(f"{file.path}: tensor {name!r} has GGML type {info.type_name}, which has no kernel")
    return info


def load_vector(file: GGUFFile, name: str, length: int) -> np.ndarray:
    """A 1-D f32/f16 tensor (norm weight, bias) as a float32 array of the given length."""
    return load_vectors(file, name, (length,))


def load_vectors(file: GGUFFile, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """An f32/f16 tensor of vectors (a norm weight or bias; one per expert: [n_expert, length]) as float32."""
    info = file.tensor(name)
    if info.shape != shape:
        raise WeightShapeError(f"{file.path}: tensor {name!r} has shape {list(info.shape)}, expected {list(shape)}")
    dtype = _FLOAT_VECTOR_TYPES.get(info.ggml_type)
    if dtype is None:
        raise UnsupportedWeightType(
            f"{file.path}: vector {name!r} has GGML type {info.type_name}; expected F32 or F16"
        )
    return file.raw(info).view(dtype).reshape(shape).astype(np.float32)
