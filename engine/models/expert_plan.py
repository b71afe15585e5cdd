"""When a Mixture-of-Experts model's experts stream from disk, into how large a cache, and the speed to expect.

A model this machine's memory cannot hold mapped, but whose other weights it can, opens with its experts
streamed (engine.models.expert_store) rather than refused. By default their cache takes a share of the memory
free once the other weights (mapped: the page cache holds them) and the runtime have theirs; a user's budget
replaces it. What to expect is bounded by the disk: a token reads, in every layer, the experts it routes to
that are not resident, about k times the share of the layer's experts not held, at the rate a read of a few of
them measured when the model opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from engine.models.expert_store import PIN_SHARE, StreamOptions
from engine.models.footprint import RUNTIME_BYTES, Footprint, available_memory, footprint, needs_streaming
from engine.models.model import Model

FREE_SHARE = 0.8  # of the memory left free by the other weights and the runtime: the experts' cache by default


def default_cache_bytes(fp: Footprint) -> int:
    """FREE_SHARE of the memory free after the other weights and the runtime, at most every expert's bytes (with
    none free, each layer still holds the one expert a token needs at a time)."""
    free = available_memory() or 8 << 30
    room = free - (fp.weight_bytes - fp.expert_bytes) - RUNTIME_BYTES
    return int(min(fp.expert_bytes, max(0, FREE_SHARE * room)))


def streaming_options(fp: Footprint, cache_bytes: int | None = None, **options) -> StreamOptions:
    """The StreamOptions of an app's streamed model: the given budget or the default one, learned pins on."""
    return StreamOptions(cache_bytes=cache_bytes or default_cache_bytes(fp), **({"pin_share": PIN_SHARE} | options))


def streaming_plan(cache_bytes: int | None = None, always: bool = False,
                   **options) -> Callable[[Footprint], StreamOptions | None]:
    """load_model's `experts`: streaming_options where the model needs them (needs_streaming) or `always`,
    else None (mapped)."""
    return lambda fp: streaming_options(fp, cache_bytes, **options) if always or needs_streaming(fp) else None


@dataclass(frozen=True)
class StreamOutlook:
    """What a streamed model is expected to read and how fast it can then decode."""

    cache_bytes: int
    expert_bytes: int
    read_bytes_per_token: float  # of experts not held, in every layer
    read_rate: float             # bytes per second, measured on this file's experts

    @property
    def tokens_per_s(self) -> float:
        return self.read_rate / self.read_bytes_per_token if self.read_bytes_per_token else float("inf")

    def headline(self) -> str:
        """"streams experts from disk: expect about 1.6 tok/s"."""
        if not self.read_bytes_per_token:  # every expert held
            return "streams experts from disk"
        return f"streams experts from disk: expect about {self.tokens_per_s:.1f} tok/s"

    def note(self) -> str:
        """The headline and the figures it comes from."""
        held = f"{self.cache_bytes / 1e9:.1f} GB of its {self.expert_bytes / 1e9:.1f} GB of experts held in memory"
        reads = (f"; about {self.read_bytes_per_token / 1e6:,.0f} MB read per token at {self.read_rate / 1e9:.1f} "
                 f"GB/s" if self.read_bytes_per_token else "")
        return f"{self.headline()} ({held}{reads})"


def outlook(model: Model) -> StreamOutlook:
    """The outlook of a model streaming its experts: a token's experts (active_expert_bytes) not held, the held
    share counted as the cache's share of them (a router's favourites do better)."""
    fp, store = footprint(model.file), model.expert_store
    cache = min(store.options.cache_bytes, fp.expert_bytes)
    missed = fp.active_expert_bytes * (1.0 - cache / fp.expert_bytes) if fp.expert_bytes else 0.0
    return StreamOutlook(cache, fp.expert_bytes, missed, store.read_rate())
