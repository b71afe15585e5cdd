"""Model families, chosen by the GGUF's `general.architecture`. A family is one file: its `ARCH` and
`model_args(metadata)`, the ModelArgs its metadata describes (the model's sizes and each layer's parts,
engine.models.parts); it is listed in FAMILIES, or registered at run time with `register_family`. The
model is built here once its args pass engine.models.validate."""

from __future__ import annotations

import os
from typing import Callable, Mapping

from engine.errors import UnsupportedArchitecture, UnsupportedOnBackend
from engine.gguf.reader import GGUFFile, open_gguf
from engine.models import gemma3, gpt_oss, llama, qwen2, qwen3, qwen3moe
from engine.models.args import ModelArgs
from engine.models.footprint import check_fits
from engine.models.model import Model
from engine.models.transformer import Transformer
from engine.models.validate import check_args, check_layer_count, check_tensors, check_weights
from engine.runtime import model_backend
from kernels.backend import Backend

FAMILIES: dict[str, Callable[[Mapping], ModelArgs]] = {
    m.ARCH: m.model_args for m in (llama, qwen2, qwen3, qwen3moe, gemma3, gpt_oss)}


def register_family(arch: str, model_args: Callable[[Mapping], ModelArgs]) -> None:
    """Load GGUFs of architecture `arch` as the ModelArgs `model_args` reads from their metadata (a family
    kept outside this package)."""
    FAMILIES[arch] = model_args


def build_model(file: GGUFFile, backend: Backend | None = None) -> Model:
    """The model of a GGUF file on `backend` (default: the one engine.runtime.configure_backend chose)."""
    arch = file.architecture
    try:
        model_args = FAMILIES[arch]
    except KeyError:
        raise UnsupportedArchitecture(
            f"{file.path}: architecture {arch!r} is not supported (supported: {', '.join(sorted(FAMILIES))})"
        ) from None
    check_layer_count(file, arch)  # before per-layer values are sized by block_count
    args = model_args(file.metadata)
    check_args(file, args)
    check_tensors(file, args)
    check_fits(file)  # before the scan: a file too large to run is not read through
    check_weights(file)
    backend = backend or model_backend()
    missing = sorted(op for op in args.ops() if not backend.supports_op(op))
    if missing:
        raise UnsupportedOnBackend(f"{file.path}: {arch} models need the {', '.join(missing)} op(s), which the "
                                   f"{backend.name} backend does not have; run this model on the CPU (--backend cpu)")
    return Transformer(file, args, backend)


def load_model(path: str | os.PathLike, backend: Backend | None = None) -> Model:
    file = open_gguf(path)
    try:
        return build_model(file, backend)
    except Exception:
        file.close()
        raise
