"""GGUF tensors bound as typed linear weights, kept in source precision (spec 13.2).

A `LinearWeight` is the tensor's raw GGUF bytes (a zero-copy view of the file's
mmap) plus its GGML type; the kernels read the blocks directly. Nothing is
widened to f32 at load. A `LinearGroup` holds several weights that share an
input (q/k/v, gate/up); the row-wise kernel runs them as one pass without copying their bytes.
"""

from __future__ import annotations

import numpy as np

from engine.errors import UnsupportedWeightType, WeightShapeError
from engine.gguf.reader import GGUFFile, ggml_type_name
from kernels.cpu import quant

_FLOAT_VECTOR_TYPES = {0: np.float32, 1: np.float16}  # 1-D norms and biases


class LinearWeight:
    """y = x @ W.T for W [out, in] stored as GGUF blocks."""

    def __init__(self, name: str, qtype: int, raw: np.ndarray, out_dim: int, in_dim: int):
        self.name = name
        self.qtype = qtype
        self.raw = raw
        self.out_dim = out_dim
        self.in_dim = in_dim

    @classmethod
    def load(cls, file: GGUFFile, name: str, out_dim: int, in_dim: int) -> "LinearWeight":
        info = file.tensor(name)
        if info.shape != (out_dim, in_dim):
            raise WeightShapeError(
                f"{file.path}: tensor {name!r} has shape {list(info.shape)}, expected [{out_dim}, {in_dim}] (out, in)"
            )
        raw = file.raw(info)
        if not quant.has_native_kernel(info.ggml_type):
            try:  # the generic path supports whatever gguf.quants can dequantize
                quant.dequantize(info.ggml_type, raw, 0, 1)
            except quant.UnsupportedQuantType:
                raise UnsupportedWeightType(
                    f"{file.path}: tensor {name!r} has GGML type {info.type_name}, which has no kernel"
                ) from None
        return cls(name, info.ggml_type, raw, out_dim, in_dim)

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.qtype)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x [n, in] -> [n, out], the prefill product (kernels.cpu.quant.matmul)."""
        return quant.matmul(self.qtype, self.raw, x)

    def row_wise(self, x: np.ndarray) -> np.ndarray:
        """x [n, in] -> [n, out] row-wise: row i bitwise what x[i] alone gives (see kernels.cpu.quant.rows)."""
        return quant.rows(self.qtype, self.raw, x)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Dequantized rows (the embedding lookup), float32 [len(ids), in]."""
        return quant.gather_rows(self.qtype, self.raw, np.asarray(ids, dtype=np.int64))


class LinearGroup:
    """Weights applied to the same input (q/k/v, gate/up): the row-wise kernel runs them as one pass;
    in prefill each is its own GEMM."""

    def __init__(self, parts: list[LinearWeight]):
        self.parts = parts

    def __call__(self, x: np.ndarray) -> list[np.ndarray]:
        return [p(x) for p in self.parts]


def load_vector(file: GGUFFile, name: str, length: int) -> np.ndarray:
    """A 1-D f32/f16 tensor (norm weight, bias) as a float32 array of the given length."""
    info = file.tensor(name)
    if info.shape != (length,):
        raise WeightShapeError(f"{file.path}: tensor {name!r} has shape {list(info.shape)}, expected [{length}]")
    dtype = _FLOAT_VECTOR_TYPES.get(info.ggml_type)
    if dtype is None:
        raise UnsupportedWeightType(
            f"{file.path}: vector {name!r} has GGML type {info.type_name}; expected F32 or F16"
        )
    return file.raw(info).view(dtype).reshape(length).astype(np.float32)
