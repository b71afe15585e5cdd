"""What a model file holds and needs, read from its header before anything loads: its family, its
parameters (in all, and per token: a Mixture-of-Experts model runs k of its n experts), its weight bytes,
and whether this machine's memory holds them.

Every token reads all of a dense model's weights (which a backend may copy into memory of its own) and, over
a few tokens, most experts (mapped from the file): a model larger than the machine's memory would page from
disk at every token, or end in an out-of-memory kill once its caches grow. It is refused before loading instead, with
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

    def streamed_bytes(self, cache_bytes: int) -> int:
        """What it needs with its experts streamed from disk into a cache of cache_bytes: the other weights, the
        cache and the runtime."""
        return self.weight_bytes - self.expert_bytes + min(cache_bytes, self.expert_bytes) + RUNTIME_BYTES


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
    limit = _cgroup_limit()
    return memory if limit is None else min(memory, limit)


def available_memory(root: Path = Path("/")) -> int | None:
    """The memory free for a model now (Linux's MemAvailable: free, and the page cache that can be let go),
    within the machine's; None where it cannot tell."""
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
                break
        else:
            return machine_memory()
    except (OSError, ValueError, IndexError):
        return machine_memory()
    memory = machine_memory()
    return free if memory is None else min(free, memory)


def _cgroup_limit(root: Path = Path("/")) -> int | None:
    """The memory limit of this process's cgroup (v2's memory.max, or v1's memory.limit_in_bytes of its own
    group under the memory controller), which counts the page cache too; None where there is none."""
    places = [root / "sys/fs/cgroup/memory.max"]
    try:
        for line in (root / "proc/self/cgroup").read_text().splitlines():
            _, controllers, group = line.split(":", 2)
            if "memory" in controllers.split(","):
                places.append(root / "sys/fs/cgroup/memory" / group.lstrip("/") / "memory.limit_in_bytes")
    except (OSError, ValueError):
        pass
    for place in places:
        try:
            text = place.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 62:  # v1 says "no limit" with a number near 2^63
            return int(text)
    return None


def check_fits(file: GGUFFile, expert_cache_bytes: int | None = None) -> Footprint:
    """The file's footprint; ModelTooLarge if this machine's memory cannot hold it (expert_cache_bytes: with its
    experts streamed from disk into a cache of that size)."""
    fp = footprint(file)
    memory = machine_memory()
    if memory is None:
        return fp
    if expert_cache_bytes is not None and fp.expert_bytes:
        needed = fp.streamed_bytes(expert_cache_bytes)
        if needed > memory:
            raise ModelTooLarge(
                f"{file.path}: with its experts streamed into a cache of {expert_cache_bytes / 1e9:.1f} GB this model "
                f"needs about {needed / 1e9:.1f} GB of memory ({(fp.weight_bytes - fp.expert_bytes) / 1e9:.1f} GB of "
                f"other weights and {RUNTIME_BYTES / 1e9:.1f} GB to run), and this machine has {memory / 1e9:.1f} GB; "
                f"choose a smaller cache")
    elif fp.needed_bytes > memory:
        stream = " or stream its experts from disk (--moe-stream)" if fp.expert_bytes else ""
        raise ModelTooLarge(
            f"{file.path}: this model needs about {fp.needed_bytes / 1e9:.1f} GB of memory "
            f"({fp.weight_bytes / 1e9:.1f} GB of weights and {RUNTIME_BYTES / 1e9:.1f} GB to run), and this "
            f"machine has {memory / 1e9:.1f} GB; choose a smaller model or a smaller quantization of it{stream}")
    return fp


def file_footprint(path: str | os.PathLike) -> Footprint:
    """The footprint of the GGUF file at `path`, from its header (GGUFError for a file that is not one)."""
    with open_gguf(path) as file:
        return footprint(file)


def fits(fp: Footprint) -> bool:
    """Whether this machine's memory holds the model (True where it cannot tell)."""
    memory = machine_memory()
    return memory is None or fp.needed_bytes <= memory


def needs_streaming(fp: Footprint) -> bool:
    """Whether the model has experts and this machine's memory cannot hold it with them mapped: they stream
    from disk (engine.models.expert_plan)."""
    return fp.expert_bytes > 0 and not fits(fp)


def opens(fp: Footprint) -> bool:
    """Whether the model runs here: it fits, or its other weights do with its experts streamed from disk
    (True where memory cannot be told)."""
    memory = machine_memory()
    return fits(fp) or (fp.expert_bytes > 0 and fp.streamed_bytes(0) <= memory)


def memory_verdict(fp: Footprint) -> str:
    """"needs about 18.3 GB of memory; this machine has 24.6 GB: it fits" (empty where it cannot tell)."""
    memory = machine_memory()
    if memory is None:
        return ""
    verdict = ("it fits" if fits(fp) else "it does not fit, and its experts stream from disk" if opens(fp)
               else "it does not fit, and loading it is refused")
    return f"needs about {fp.needed_bytes / 1e9:.1f} GB of memory; this machine has {memory / 1e9:.1f} GB: {verdict}"


def describe(fp: Footprint) -> str:
    """"qwen3moe, 30.5B parameters (3.3B per token), 17.3 GB"."""
    per_token = "" if fp.active_parameters == fp.parameters else f" ({_count(fp.active_parameters)} per token)"
    return f"{fp.family}, {_count(fp.parameters)} parameters{per_token}, {fp.weight_bytes / 1e9:.1f} GB"


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
