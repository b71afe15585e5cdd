"""Experts streamed from disk (the spec's ExpertStore, 13.2.2): a Mixture-of-Experts model's expert tensors
registered, not read, at load, and each (layer, expert)'s rows read with pread when a call routes to it and it
is not resident, into a cache with a byte budget.

Through the page cache, a model bigger than memory thrashes: the dense weights every token needs are evicted by
experts it needed once. Here the experts live in buffers of their own, a slot per resident expert in each
layer (the budget split evenly over the layers), so the dense weights' mapped pages are not competed for by
them. A layer's slots hold its stacked tensors' rows in the file's own layout, and the kernels read them as
they read the mapped tensors (kernels.backend.ExpertSource): streaming changes when bytes arrive, never the
numbers.

Eviction by heat (the default): each slot's routed-pair count, decayed at every call of its layer; the victim
is the coldest slot the current call does not use, the least recently used among equals. `policy="lru"` evicts
the least recently used for comparison. Each run's rows routed per expert are added to a usage file beside the
model (USAGE_SUFFIX); with `pin_share`, a layer's most routed experts there keep that share of its slots once
read (pinned: never evicted but by a call that needs every slot), unless its usage is too flat for pins to keep
more traffic than other slots would. A file that changes or shrinks under a running stream is an error that
says so, never a crash or a silent wrong answer.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from engine.errors import FucinaError
from engine.gguf.reader import TensorInfo

POLICIES = ("heat", "lru")
PIN_SHARE = 0.5  # of a layer's slots, pinned for its most routed experts where learned pins are on
USAGE_SUFFIX = ".experts"  # beside the model: the rows routed to each expert of each layer, over its runs
_FADVISE = hasattr(os, "posix_fadvise")
PROBE_BYTES = 64 << 20  # read to measure the disk's rate (ExpertStore.read_rate)


class ExpertStoreError(FucinaError):
    """Experts cannot be read from the model file (it changed or shrank under the stream)."""


def load_usage(path: str | os.PathLike) -> dict[int, np.ndarray]:
    """A usage file's rows routed per expert, by layer; {} where there is none or it is damaged (it only ever
    chooses pins)."""
    try:
        with np.load(path) as z:
            return {int(k): np.asarray(z[k], np.int64) for k in z.files}
    except (OSError, ValueError, KeyError, EOFError):
        return {}


@dataclass(frozen=True)
class StreamOptions:
    cache_bytes: int              # resident experts' budget, over every layer
    policy: str = "heat"          # one of POLICIES
    heat_decay: float = 0.9       # each slot's heat times this at every call of its layer
    trace: bool = False           # record every layer's routed experts in order (ExpertStore.trace)
    io_threads: int = 4           # a call's missing experts are read this many at a time (1: in turn)
    pin_share: float = 0.0        # each layer's slots kept for its most routed experts in earlier runs (the
    #                               usage beside the model, USAGE_SUFFIX); 0: no pins
    pin_min_advantage: float = 1.5  # pins only where they took this many times their share of the rows (else flat)
    prefetch: bool = False        # while a layer computes, read what the next one's router would pick from its input

    def __post_init__(self):
        if self.cache_bytes < 0:
            raise ValueError(f"the experts' cache budget must not be negative (got {self.cache_bytes} bytes)")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown expert cache policy {self.policy!r} (one of {', '.join(POLICIES)})")
        if not 0.0 < self.heat_decay <= 1.0:
            raise ValueError(f"heat_decay must be in (0, 1] (got {self.heat_decay})")
        if self.io_threads < 1:
            raise ValueError(f"io_threads must be at least 1 (got {self.io_threads})")
        if not 0.0 <= self.pin_share < 1.0:
            raise ValueError(f"pin_share must be in [0, 1) (got {self.pin_share})")


def choose_pins(counts: np.ndarray, capacity: int, share: float, min_advantage: float) -> np.ndarray | None:
    """A layer's most routed experts by `counts` (rows routed to each), in `share` of its `capacity` slots; None
    where they took under min_advantage times their share of the rows (a flat histogram: pins would keep no more
    traffic than any other slots); empty where there is nothing to pin."""
    n_expert, n = counts.size, int(capacity * share)
    if n < 1 or n >= n_expert or counts.sum() <= 0:
        return np.zeros(0, np.int64)
    top = np.argsort(-counts, kind="stable")[:n]
    if counts[top].sum() / counts.sum() < min_advantage * n / n_expert:
        return None
    return top.astype(np.int64)


@dataclass
class StreamStats:
    hits: int = 0           # routed experts found resident
    misses: int = 0         # read from the file
    bytes_read: int = 0
    pinned: int = 0         # experts pinned, over every layer
    pins_declined: int = 0  # layers whose earlier usage was too flat to pin
    prefetched: int = 0     # experts read ahead of their layer on a prediction
    prefetch_used: int = 0  # of them, routed to when their layer came

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


@dataclass
class Trace:
    """The routed (layer, experts, rows routed to each) of every acquire, in order, and each layer's expert
    count and slots: what a replay (engine.models.expert_replay) runs other policies and capacities on."""

    layers: dict[int, tuple[int, int]] = field(default_factory=dict)  # layer -> (n_expert, capacity)
    calls: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)

    def add(self, layer: int, experts: np.ndarray, pairs: np.ndarray) -> None:
        self.calls.append((layer, np.array(experts, np.int64), np.array(pairs, np.int64)))

    def save(self, path: str | os.PathLike) -> None:
        sizes = np.array([len(e) for _, e, _ in self.calls], np.int64)
        def flat(i):
            return np.concatenate([c[i] for c in self.calls]) if self.calls else np.zeros(0, np.int64)

        layers = np.array(sorted(self.layers), np.int64)
        with open(path, "wb") as f:
            np.savez(f, layer=np.array([c[0] for c in self.calls], np.int64), size=sizes, experts=flat(1),
                     pairs=flat(2), layers=layers, geometry=np.array([self.layers[i] for i in layers], np.int64))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Trace:
        try:
            with np.load(path) as z:
                bounds = np.concatenate([[0], np.cumsum(z["size"])])
                calls = [(int(layer), z["experts"][a:b], z["pairs"][a:b])
                         for layer, a, b in zip(z["layer"], bounds[:-1], bounds[1:])]
                layers = {int(i): (int(n), int(c)) for i, (n, c) in zip(z["layers"], z["geometry"])}
        except (OSError, ValueError, KeyError) as e:
            raise ExpertStoreError(f"{path}: not an experts trace ({e})") from None
        return cls(layers, calls)


@dataclass(frozen=True)
class _Stack:
    """One stacked experts tensor of a layer: expert e's rows are bytes [offset + e * nbytes, + nbytes)."""

    offset: int
    nbytes: int     # one expert's
    rows: int       # one expert's
    row_bytes: int


class ExpertStore:
    """The experts of one model file, read on demand: `layer` registers a layer's three stacked tensors and
    gives the ExpertSource its feed-forward reads."""

    def __init__(self, path: str | os.PathLike, options: StreamOptions, layers: int):
        self.path = str(path)
        self.options = options
        self.layers = max(1, layers)  # the layers the budget is split over
        self.stats = StreamStats()
        self._fd = os.open(self.path, os.O_RDONLY)
        st = os.fstat(self._fd)
        self._identity = (st.st_size, st.st_mtime_ns, st.st_ino)
        self.trace: Trace | None = Trace() if options.trace else None
        self.usage: dict[int, np.ndarray] = {}  # layer -> rows routed to each expert in this run
        self._earlier = load_usage(self.path + USAGE_SUFFIX) if options.pin_share else {}
        # a disk answers several reads at once faster than in turn (the calls release the GIL)
        self._io = ThreadPoolExecutor(options.io_threads, "experts-io") if options.io_threads > 1 else None
        # prefetches run here, their reads on the I/O threads (never from an I/O thread: no pool waits on itself)
        self._ahead = ThreadPoolExecutor(1, "experts-ahead") if options.prefetch else None
        self._count_lock = threading.Lock()  # the stats, counted from the prefetch thread too
        self._stacks: dict[int, tuple[list[_Stack], int]] = {}  # each registered layer's, its experts' count

    def layer(self, layer: int, gate: TensorInfo, up: TensorInfo, down: TensorInfo, n_expert: int) -> LayerExperts:
        """Layer `layer`'s experts (gate and up [n_expert, n_ff, n_embd], down [n_expert, n_embd, n_ff] in the
        file): only their geometry is checked, nothing of them read."""
        stacks = []
        for info in (gate, up, down):
            if info.nbytes % n_expert or info.offset + info.nbytes > self._identity[0]:
                raise ExpertStoreError(f"{self.path}: tensor {info.name!r} does not hold {n_expert} experts inside "
                                       f"the file")
            rows = info.shape[1]
            nbytes = info.nbytes // n_expert
            stacks.append(_Stack(info.offset, nbytes, rows, nbytes // rows))
        per_expert = sum(s.nbytes for s in stacks)
        self._stacks[layer] = stacks, n_expert
        capacity = int(min(n_expert, max(1, self.options.cache_bytes // (self.layers * per_expert))))
        if self.trace is not None:
            self.trace.layers[layer] = (n_expert, capacity)
        self.usage[layer] = np.zeros(n_expert, np.int64)
        return LayerExperts(self, layer, stacks, n_expert, capacity, self._pins(layer, n_expert, capacity))

    def _pins(self, layer: int, n_expert: int, capacity: int) -> np.ndarray:
        """The layer's pins from earlier runs' usage (choose_pins), counted in the stats."""
        counts = self._earlier.get(layer)
        if counts is None or counts.shape != (n_expert,):
            return np.zeros(0, np.int64)
        pins = choose_pins(counts, capacity, self.options.pin_share, self.options.pin_min_advantage)
        if pins is None:
            self.stats.pins_declined += 1
            return np.zeros(0, np.int64)
        self.stats.pinned += pins.size
        return pins

    def save_usage(self) -> None:
        """This run's routed rows per expert added to the earlier runs' beside the model (what pins the next
        load's experts); a place that cannot be written keeps what it had."""
        merged = load_usage(self.path + USAGE_SUFFIX)
        for layer, counts in self.usage.items():
            earlier = merged.get(layer)
            merged[layer] = counts + earlier if earlier is not None and earlier.shape == counts.shape else counts
        aside = f"{self.path}{USAGE_SUFFIX}.{os.getpid()}.tmp"
        with open(aside, "wb") as f:
            np.savez(f, **{str(layer): counts for layer, counts in merged.items()})
        os.replace(aside, self.path + USAGE_SUFFIX)

    def record(self, layer: int, experts: np.ndarray, pairs: np.ndarray) -> None:
        """One layer's acquire, into its usage and the trace when there is one."""
        np.add.at(self.usage[layer], experts, pairs)
        if self.trace is not None:
            self.trace.add(layer, experts, pairs)

    def read_into(self, buffer: np.ndarray, offset: int, what: str) -> None:
        """buffer's bytes from the file at offset, or an ExpertStoreError naming `what`."""
        try:
            got = os.preadv(self._fd, [memoryview(buffer).cast("B")], offset)
        except OSError as e:
            raise ExpertStoreError(f"{self.path}: cannot read {what}: {e.strerror}") from None
        if got != buffer.nbytes or self._changed():
            raise ExpertStoreError(f"{self.path}: the model file changed under the running model ({what} is "
                                   f"not where it was when loaded); load it again")
        if _FADVISE:  # the copy is in the cache's slot now: the page cache keeps the dense weights' pages instead
            os.posix_fadvise(self._fd, offset, got, os.POSIX_FADV_DONTNEED)

    def _changed(self) -> bool:
        st = os.fstat(self._fd)
        return (st.st_size, st.st_mtime_ns, st.st_ino) != self._identity

    def read_all(self, reads: list[tuple[np.ndarray, int, str]]) -> list[BaseException | None]:
        """read_into for each (buffer, offset, what), on the I/O threads: the error of each, or None."""
        def attempt(read):
            try:
                self.read_into(*read)
            except Exception as e:  # noqa: BLE001  (returned to the caller, which knows the slot it was for)
                return e
            return None
        errors = self._each(attempt, reads)
        with self._count_lock:
            self.stats.bytes_read += sum(buffer.nbytes for (buffer, _, _), e in zip(reads, errors) if e is None)
        return errors

    def read_rate(self) -> float:
        """Bytes per second the experts read at from the disk: about PROBE_BYTES of the last layer's, their pages
        dropped from the page cache first, read as a call's misses are (on the I/O threads); not counted in the
        stats."""
        stacks, n_expert = self._stacks[max(self._stacks)]
        experts = min(n_expert, max(1, PROBE_BYTES // sum(s.nbytes for s in stacks)))
        reads = [(np.empty(s.nbytes, np.uint8), s.offset + e * s.nbytes, "experts") for e in range(experts)
                 for s in stacks]
        if _FADVISE:
            for buffer, offset, _ in reads:
                os.posix_fadvise(self._fd, offset, buffer.nbytes, os.POSIX_FADV_DONTNEED)
        start = time.perf_counter()
        self._each(lambda read: self.read_into(*read), reads)
        return sum(buffer.nbytes for buffer, _, _ in reads) / max(time.perf_counter() - start, 1e-6)

    def _each(self, read, reads: list) -> list:
        """read(r) for each of reads, on the I/O threads where there are several: the results, in order."""
        if self._io is not None and len(reads) > 1:
            return list(self._io.map(read, reads))
        return [read(r) for r in reads]

    def read_ahead(self, reads: list[tuple[np.ndarray, int, str]]):
        """read_all(reads) on the prefetch thread: its future."""
        return self._ahead.submit(self.read_all, reads)

    def close(self) -> None:
        for pool in (self._ahead, self._io):
            if pool is not None:
                pool.shutdown()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class SlotCache:
    """Which experts of a layer sit in which of its `capacity` slots, and which go when another comes: the
    cache's policy alone, no bytes (what a replay of a trace runs too)."""

    def __init__(self, n_expert: int, capacity: int, policy: str = "heat", heat_decay: float = 0.9,
                 pins: np.ndarray = np.zeros(0, np.int64)):
        self.capacity, self.policy, self.heat_decay = capacity, policy, heat_decay
        self.pinned = np.zeros(n_expert, bool)  # experts never evicted once read (fewer than the slots)
        self.pinned[pins] = True
        self.slot_of = np.full(n_expert, -1, np.int64)
        self.expert_in = np.full(capacity, -1, np.int64)
        self._heat = np.zeros(capacity, np.float64)
        self._last = np.zeros(capacity, np.int64)
        self._tick = 0

    def call_groups(self, experts: np.ndarray) -> list[np.ndarray]:
        """The indices into a call's distinct experts of each group it is made resident and computed in: one
        group while they fit the slots, else the resident ones first (so the call does not evict them before
        their turn), `capacity` at a time."""
        if len(experts) <= self.capacity:
            return [np.arange(len(experts))]
        held = self.slot_of[experts] >= 0
        order = np.concatenate([np.flatnonzero(held), np.flatnonzero(~held)])
        return [order[c : c + self.capacity] for c in range(0, order.size, self.capacity)]

    def acquire(self, experts: np.ndarray, pairs: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """The slots of these distinct experts (at most capacity), and the (expert, slot) pairs to read in:
        each expert not resident takes an empty slot, else evicts (heat: the coldest slot this call does not
        use, the least recent among equals; lru: the least recent). pairs: the rows routed to each, its heat."""
        if len(experts) > self.capacity:
            raise ValueError(f"{len(experts)} experts asked of a layer holding {self.capacity}")
        self._tick += 1
        self._heat *= self.heat_decay
        in_use = np.zeros(self.capacity, bool)
        slots = np.empty(len(experts), np.int64)
        loads = []
        for i, e in enumerate(experts):
            s = self._slot_for(int(e), in_use, loads)
            self._heat[s] += pairs[i]
            self._last[s] = self._tick
            slots[i] = s
        return slots, loads

    def reserve(self, experts: np.ndarray) -> list[tuple[int, int]]:
        """Slots for these experts ahead of their call, as acquire would take them, without counting a use: the
        (expert, slot) pairs to read in. Each read in is the coldest of its layer until used, so a wrong guess is
        the first to go."""
        loads = []
        in_use = np.zeros(self.capacity, bool)
        for e in experts[: self.capacity]:
            s = self._slot_for(int(e), in_use, loads)
            if loads and loads[-1] == (e, s):
                self._last[s] = 0  # not used yet: older than any slot that was
        return loads

    def _slot_for(self, e: int, in_use: np.ndarray, loads: list[tuple[int, int]]) -> int:
        """The slot of expert e, now in use: its own, else a victim's (its heat 0, (e, slot) added to loads)."""
        s = int(self.slot_of[e])
        if s < 0:
            s = self._victim(in_use)
            old = self.expert_in[s]
            if old >= 0:
                self.slot_of[old] = -1
            self.expert_in[s], self.slot_of[e], self._heat[s] = e, s, 0.0
            loads.append((e, s))
        in_use[s] = True
        return s

    def forget(self, slot: int) -> None:
        """The slot holds nothing (its read failed)."""
        expert = self.expert_in[slot]
        if expert >= 0:
            self.slot_of[expert] = -1
        self.expert_in[slot] = -1

    def _victim(self, in_use: np.ndarray) -> int:
        free = np.flatnonzero(self.expert_in < 0)
        if free.size:
            return int(free[0])
        candidates = np.flatnonzero(~in_use & ~self.pinned[self.expert_in])
        if not candidates.size:  # every other slot pinned: a pin gives way rather than the call
            candidates = np.flatnonzero(~in_use)
        if self.policy == "heat":
            order = np.lexsort((self._last[candidates], self._heat[candidates]))
        else:
            order = np.argsort(self._last[candidates], kind="stable")
        return int(candidates[order[0]])


@dataclass
class LayerExperts:
    """One layer's resident experts (a kernels.backend.ExpertSource): `capacity` slots in stacked buffers."""

    store: ExpertStore
    layer: int
    stacks: list[_Stack]
    n_expert: int
    capacity: int
    pins: np.ndarray
    gate: np.ndarray = field(init=False)
    up: np.ndarray = field(init=False)
    down: np.ndarray = field(init=False)

    def __post_init__(self):
        self.gate, self.up, self.down = (np.zeros((self.capacity * s.rows, s.row_bytes), np.uint8)
                                         for s in self.stacks)
        options = self.store.options
        self.slots = SlotCache(self.n_expert, self.capacity, options.policy, options.heat_decay, self.pins)
        self._ahead = None  # a prefetch in flight: ((expert, slot) pairs, its future)
        self._prefetched = np.zeros(self.n_expert, bool)  # read ahead and not routed to since

    def held(self) -> list[int]:
        """The experts resident now, in order."""
        return sorted(int(e) for e in self.slots.expert_in if e >= 0)

    def prefetch(self, experts: np.ndarray) -> None:
        """Start reading these experts (a prediction of the next call's) on the prefetch thread, unless a
        prefetch is still in flight; the next acquire waits for it."""
        if self._ahead is not None:
            return
        loads = self.slots.reserve(experts)
        if loads:
            self._prefetched[[e for e, _ in loads]] = True
            self.store.stats.prefetched += len(loads)
            self._ahead = (loads, self.store.read_ahead(self._reads(loads)))

    def _settle(self) -> None:
        """Wait for the prefetch in flight; the slots whose reads failed hold nothing (a routed call reads them
        again, and says why if it fails too)."""
        loads, future = self._ahead
        self._ahead = None
        errors = future.result()
        for i, error in enumerate(errors):
            if error is not None:
                expert, slot = loads[i // len(self.stacks)]
                self._prefetched[expert] = False
                if self.slots.expert_in[slot] == expert:
                    self.slots.forget(slot)

    def _reads(self, loads: list[tuple[int, int]]) -> list[tuple[np.ndarray, int, str]]:
        return [(buffer[slot * stack.rows : (slot + 1) * stack.rows], stack.offset + expert * stack.nbytes,
                 f"expert {expert} of layer {self.layer}")
                for expert, slot in loads for stack, buffer in zip(self.stacks, (self.gate, self.up, self.down))]

    def acquire_groups(self, experts: np.ndarray, pairs: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """A call's distinct experts made resident group by group (SlotCache.call_groups): yields each group's
        indices into `experts` and their slots, read in where not resident; a group's slots hold it until the
        next is asked for. pairs: the rows routed to each, their heat."""
        if self._ahead is not None:
            self._settle()
        self.store.record(self.layer, experts, pairs)
        ahead = self._prefetched[experts] & (self.slots.slot_of[experts] >= 0)
        self.store.stats.prefetch_used += int(ahead.sum())
        self._prefetched[experts] = False
        for group in self.slots.call_groups(experts):
            yield group, self.acquire(experts[group], pairs[group])

    def acquire(self, experts: np.ndarray, pairs: np.ndarray) -> np.ndarray:
        """The slots of these distinct experts (at most capacity), each read into one where not resident."""
        slots, loads = self.slots.acquire(experts, pairs)
        self.store.stats.hits += len(experts) - len(loads)
        errors = self.store.read_all(self._reads(loads))
        failed = {loads[i // len(self.stacks)][1] for i, e in enumerate(errors) if e is not None}
        for slot in failed:  # a slot whose bytes did not all arrive holds nothing
            self.slots.forget(slot)
        self.store.stats.misses += len(loads) - len(failed)
        if failed:
            raise next(e for e in errors if e is not None)
        return slots
