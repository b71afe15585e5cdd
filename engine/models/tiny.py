"""Tiny GGUFs of any family, their tensors taken from the family's own layout (engine.models.layout): the
kernel warm-up's zero-weight models (engine/platform/warmup.py) and the tests' random ones are written through
here, so neither lists a family's tensors again."""

from __future__ import annotations

import gguf
from gguf.constants import GGUFValueType as V

from engine.models import FAMILIES
from engine.models.layout import TensorSpec

_VALUE_TYPES = {bool: V.BOOL, int: V.UINT32, float: V.FLOAT32, str: V.STRING, list: V.ARRAY}


def standard_metadata(arch: str, *, n_layers: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int,
                      vocab: int, head_dim: int | None = None, window: int = 8, context: int = 256) -> dict:
    """The "<arch>.*" keys of a model of these sizes (a family that has no sliding window ignores it)."""
    meta = {"block_count": n_layers, "embedding_length": n_embd, "feed_forward_length": n_ff,
            "attention.head_count": n_head, "attention.head_count_kv": n_head_kv, "context_length": context,
            "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 10000.0, "vocab_size": vocab,
            "attention.sliding_window": window}
    if head_dim:
        meta |= {"attention.key_length": head_dim, "attention.value_length": head_dim}
    return {f"{arch}.{key}": value for key, value in meta.items()}


def tensors(arch: str, meta: dict) -> list[TensorSpec]:
    """The tensors a model of `arch` with this metadata has (the family reads the metadata as a file's)."""
    return FAMILIES[arch](meta).tensors()


def write_metadata(writer: gguf.GGUFWriter, meta: dict) -> None:
    for key, value in meta.items():
        writer.add_key_value(key, value, _VALUE_TYPES[type(value)])

