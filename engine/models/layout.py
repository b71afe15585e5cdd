"""A family's tensors as one table: each tensor's GGUF name, shape, role and whether a file must have it.

Each part of a layer (engine.models.parts) lists its own tensors; ModelArgs.tensors puts a model's together.
The loader reads weights by the names a part listed; the writers of tiny models (the kernel warm-up's,
engine/platform/warmup.py, and the tests' synthetic models) write exactly the tensors it lists. So a family's
tensors are described once, as llama.cpp's LLM_TENSOR_* names and create_tensor(..., TENSOR_NOT_REQUIRED).
"""

from __future__ import annotations

from dataclasses import dataclass

MATRIX, EXPERTS, NORM, BIAS = "matrix", "experts", "norm", "bias"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # (out, in) for a matrix, as the loader checks it; (n_expert, out, in) for stacked
                            # experts' matrices ((n_head, out, in): per-head ones); (n,) for a vector,
                            # (n_expert, n) for one per expert
    role: str               # MATRIX, EXPERTS, NORM (values near 1) or BIAS (values near 0): what a writer
                            # fills it with
    required: bool = True   # False: the model does without it (an untied output matrix)


def matrix(name: str, rows: int, cols: int, required: bool = True) -> TensorSpec:
    return TensorSpec(name, (rows, cols), MATRIX, required)


def experts(name: str, n_expert: int, rows: int, cols: int) -> TensorSpec:
    """One matrix [rows, cols] per expert, stacked in one tensor (llama.cpp's *_exps)."""
    return TensorSpec(name, (n_expert, rows, cols), EXPERTS)


def heads(name: str, n_head: int, rows: int, cols: int) -> TensorSpec:
    """One matrix [rows, cols] per attention head, stacked in one tensor (MLA's attn_k_b, attn_v_b): written and
    quantized as a matrix."""
    return TensorSpec(name, (n_head, rows, cols), MATRIX)


def norm(name: str, n: int) -> TensorSpec:
    return TensorSpec(name, (n,), NORM)


def bias(name: str, *shape: int) -> TensorSpec:
    """A bias [n], or one per expert [n_expert, n]."""
    return TensorSpec(name, shape, BIAS)


def layer_prefix(layer: int) -> str:
    return f"blk.{layer}."
