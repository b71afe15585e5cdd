"""Model families, chosen by the GGUF's `general.architecture`. A new family is one new file: its `ARCH`
and `model_args(file)`, the ModelArgs its metadata describes; the model is built here once they pass
engine.models.validate."""

from __future__ import annotations

import os

from engine.errors import UnsupportedArchitecture
from engine.gguf.reader import GGUFFile, open_gguf
from engine.models import gemma3, llama, qwen2, qwen3
from engine.models.transformer import Transformer
from engine.models.validate import check_args, check_layer_count, check_weights
from engine.runtime import model_backend
from kernels.backend import Backend

FAMILIES = {m.ARCH: m.model_args for m in (llama, qwen2, qwen3, gemma3)}


def build_model(file: GGUFFile, backend: Backend | None = None) -> Transformer:
    """The model of a GGUF file on `backend` (default: the one engine.runtime.configure_backend chose)."""
    arch = file.architecture
    try:
        model_args = FAMILIES[arch]
    except KeyError:
        raise UnsupportedArchitecture(
            f"{file.path}: architecture {arch!r} is not supported (supported: {', '.join(sorted(FAMILIES))})"
        ) from None
    check_layer_count(file, arch)  # before per-layer values are sized by block_count
    args = model_args(file)
    check_args(file, args)
    check_weights(file)
    return Transformer(file, args, backend or model_backend())


def load_model(path: str | os.PathLike, backend: Backend | None = None) -> Transformer:
    file = open_gguf(path)
    try:
        return build_model(file, backend)
    except Exception:
        file.close()
        raise
