"""Model families, chosen by the GGUF's `general.architecture`. A family is one file: its `ARCH` and
`model_args(metadata)`, the ModelArgs its metadata describes (the model's sizes and each layer's parts,
engine.models.parts); it is listed in FAMILIES, or registered at run time with `register_family`. The
model is built here once its args pass engine.models.validate."""

from __future__ import annotations

import os
import warnings
from typing import Callable, Mapping

from engine.errors import SlowWeightTypeWarning, UnsupportedArchitecture, UnsupportedOnBackend
from engine.gguf.reader import GGUFFile, open_gguf
from engine.models import (
    deepseek2, gemma3, gemma4, glm4moe, gpt_oss, llama, qwen2, qwen3, qwen3moe, qwen35, qwen35moe,
)
from engine.models.args import ModelArgs
from engine.models.expert_store import StreamOptions
from engine.models.footprint import Footprint, check_fits, footprint as footprint_of  # the module keeps its name
from engine.models.model import Model
from engine.models.next_token import missing_tensors
from engine.models.transformer import Transformer
from engine.models.validate import check_args, check_layer_count, check_tensors, check_weights
from engine.runtime import model_backend
from kernels.backend import Backend

FAMILIES: dict[str, Callable[[Mapping], ModelArgs]] = {
    m.ARCH: m.model_args for m in (llama, qwen2, qwen3, qwen3moe, gemma3, gemma4, gpt_oss, deepseek2, glm4moe,
                                   qwen35, qwen35moe)}


def register_family(arch: str, model_args: Callable[[Mapping], ModelArgs]) -> None:
    """Load GGUFs of architecture `arch` as the ModelArgs `model_args` reads from their metadata (a family
    kept outside this package)."""
    FAMILIES[arch] = model_args


def build_model(file: GGUFFile, backend: Backend | None = None, expert_cache_bytes: int | None = None) -> Model:
    """The model of a GGUF file on `backend` (default: the one engine.runtime.configure_backend chose);
    expert_cache_bytes: its experts will stream from disk into a cache of that size (what memory it needs)."""
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
    check_fits(file, expert_cache_bytes)  # before the scan: a file too large to run is not read through
    check_weights(file)
    backend = backend or model_backend()
    missing = sorted(op for op in args.ops() if not backend.supports_op(op))
    if missing:
        raise UnsupportedOnBackend(f"{file.path}: {arch} models need the {', '.join(missing)} op(s), which the "
                                   f"{backend.name} backend does not have; run this model on the CPU (--backend cpu)")
    warn_generic_types(file, backend)
    return Transformer(file, args, backend)


def warn_generic_types(file: GGUFFile, backend: Backend) -> None:
    """A SlowWeightTypeWarning naming the weight types the backend has no kernels of its own for, and which
    tensors have them (the embedding table only gives rows: it is read through the generic path at no cost,
    unless it is also the output matrix)."""
    tied = "output.weight" not in file.tensors
    slow: dict[str, list[str]] = {}
    for info in file.tensors.values():
        product = len(info.shape) > 1 and (tied or info.name != "token_embd.weight")
        if product and not backend.native(info.ggml_type):
            slow.setdefault(info.type_name, []).append(info.name)
    for type_name, names in slow.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        warnings.warn(SlowWeightTypeWarning(
            f"{file.path}: {len(names)} weight(s) are {type_name} ({shown}), which the {backend.name} backend "
            f"multiplies through its generic path (dequantized tiles): correct, but several times slower than a "
            f"format with its own kernels (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, MXFP4); a quantization in one of those "
            f"runs faster"), stacklevel=3)


def kv_bytes_per_token(file: GGUFFile) -> int | None:
    """What each position of a chat takes in an f16 KV cache, from the family's args (latent attention keeps
    one row where attention keeps a key and a value per KV head); None for an architecture not supported."""
    model_args = FAMILIES.get(file.architecture)
    if model_args is None:
        return None
    args = model_args(file.metadata)
    heads, dims = args.kv_geometry()
    return sum(h * d * 2 * (1 if shared else 2) for h, d, shared in zip(heads, dims, args.kv_value_is_key()))


def has_next_token_layer(file: GGUFFile) -> bool:
    """Whether the file holds a whole next-token-prediction layer (GLM-4.5's MTP), which speculation drafts from."""
    model_args = FAMILIES.get(file.architecture)
    if model_args is None:
        return False
    args = model_args(file.metadata)
    return bool(args.next_token_layers) and missing_tensors(file, args.next_token_layers[0], args.n_layers,
                                                           args.n_embd, args.vocab_size) == []


def load_model(path: str | os.PathLike, backend: Backend | None = None,
               experts: StreamOptions | Callable[[Footprint], StreamOptions | None] | None = None) -> Model:
    """The model of the GGUF at `path`; experts: its experts read from the file on demand into a cache of this
    budget (engine.models.expert_store) rather than mapped, or a function of the file's footprint that says
    whether and how (engine.models.expert_plan.streaming_plan: decided on the header read here, not read again)."""
    file = open_gguf(path)
    try:
        if callable(experts):
            experts = experts(footprint_of(file))
        model = build_model(file, backend, None if experts is None else experts.cache_bytes)
        if experts is not None:
            model.stream_experts(experts)
        return model
    except Exception:
        file.close()
        raise
