"""Model families, chosen by the GGUF's `general.architecture`. A new family is one new file."""

from __future__ import annotations

import os

from engine.errors import UnsupportedArchitecture
from engine.gguf.reader import GGUFFile, open_gguf
from engine.models import gemma3, llama, qwen2, qwen3
from engine.models.transformer import Transformer

FAMILIES = {m.ARCH: m.build for m in (llama, qwen2, qwen3, gemma3)}


def build_model(file: GGUFFile) -> Transformer:
    arch = file.architecture
    try:
        build = FAMILIES[arch]
    except KeyError:
        raise UnsupportedArchitecture(
            f"{file.path}: architecture {arch!r} is not supported (supported: {', '.join(sorted(FAMILIES))})"
        ) from None
    return build(file)


def load_model(path: str | os.PathLike) -> Transformer:
    file = open_gguf(path)
    try:
        return build_model(file)
    except Exception:
        file.close()
        raise
