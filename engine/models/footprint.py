"""What a model file holds and needs, read from its header before anything loads: its family, its
parameters (in all, and per token: a Mixture-of-Experts model runs k of its n experts), its weight bytes,
and whether this machine's memory holds them.

The weights are mapped from the file, not copied, but every token reads all of a dense model's weights and,
over a few tokens, most experts: a model larger than the machine's memory would page from disk at every
token, or end in an out-of-memory kill once its caches grow. It is refused before loading instead, with
the sizes in the message.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelTooLarge
from engine.gguf.meta import meta_value
from engine.gguf.reader import GGUFFile, open_gguf

# beside the weights: the KV cache of a long chat, activations, the app and Python itself
RUNTIME_BYTES = 1 << 30
_EXPERTS = "_exps."  # the stacked experts' tensors: blk.N.ffn_{gate,up,down}_exps.weight


@dataclass(frozen=True)
class Footprint:
    family: str
    parameters: int
    active_parameters: int  # per token
    weight_bytes: int
    expert_bytes: int
    active_expert_bytes: int  # the bytes of the k experts a token runs in every layer

    @property
    def needed_bytes(self) -> int:
        return self.weight_bytes + RUNTIME_BYTES


def footprint(file: GGUFFile) -> Footprint:
    arch = file.architecture
    n_expert = meta_value(file.metadata, f"{arch}.expert_count", "integer") or 0
    n_used = meta_value(file.metadata, f"{arch}.expert_used_count", "integer") or 0
    parameters = active = weight_bytes = expert_bytes = active_expert_bytes = 0
    for info in file.tensors.values():
        count = math.prod(info.shape)
        parameters += count
        weight_bytes += info.nbytes
        if is_experts(info.name) and n_expert:
            expert_bytes += info.nbytes
            active_expert_bytes += info.nbytes * min(n_used, n_expert) // n_expert
            count = count * min(n_used, n_expert) // n_expert
        active += count
    return Footprint(arch, parameters, active, weight_bytes, expert_bytes, active_expert_bytes)


def is_experts(tensor_name: str) -> bool:
    """Whether the tensor is a stacked experts' tensor (blk.N.ffn_{gate,up,down}_exps.weight)."""
    return _EXPERTS in tensor_name


def machine_memory() -> int | None:
    """This machine's memory in bytes (a container's limit where lower), or None where it cannot tell."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows)
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            memory = min(memory, int(limit))
    except OSError:
        pass
    return memory


def check_fits(file: GGUFFile) -> Footprint:
    """The file's footprint; ModelTooLarge if this machine's memory cannot hold it."""
    fp = footprint(file)
    memory = machine_memory()
    if memory is not None and fp.needed_bytes > memory:
        raise ModelTooLarge(
            f"{file.path}: this model needs about {fp.needed_bytes / 1e9:.1f} GB of memory "
            f"({fp.weight_bytes / 1e9:.1f} GB of weights and {RUNTIME_BYTES / 1e9:.1f} GB to run), and this "
            f"machine has {memory / 1e9:.1f} GB; choose a smaller model or a smaller quantization of it")
    return fp


def file_footprint(path: str | os.PathLike) -> Footprint:
    """The footprint of the GGUF file at `path`, from its header (GGUFError for a file that is not one)."""
    with open_gguf(path) as file:
        return footprint(file)


def fits(fp: Footprint) -> bool:
    """Whether this machine's memory holds the model (True where it cannot tell)."""
    memory = machine_memory()
    return memory is None or fp.needed_bytes <= memory


def memory_verdict(fp: Footprint) -> str:
    """"needs about 18.3 GB of memory; this machine has 24.6 GB: it fits" (empty where it cannot tell)."""
    memory = machine_memory()
    if memory is None:
        return ""
    return (f"needs about {fp.needed_bytes / 1e9:.1f} GB of memory; this machine has {memory / 1e9:.1f} GB: "
            + ("it fits" if fits(fp) else "it does not fit, and loading it is refused"))


def describe(fp: Footprint) -> str:
    """"qwen3moe, 30.5B parameters (3.3B per token), 17.3 GB"."""
    per_token = "" if fp.active_parameters == fp.parameters else f" ({_count(fp.active_parameters)} per token)"
    return f"{fp.family}, {_count(fp.parameters)} parameters{per_token}, {fp.weight_bytes / 1e9:.1f} GB"


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
