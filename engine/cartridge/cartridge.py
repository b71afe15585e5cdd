"""A document's KV rows, served as a preloaded prefix (spec 13.10).

A Cartridge holds, per layer, the K and V rows a prefill of the wrapped document wrote into a KV cache:
post-RoPE keys at positions 0..rows-1, in the cache's storage form (f16 bits or q8_0 blocks), so writing
them back into an empty cache gives bitwise the cache that prefill left, and a chat continued from it
computes bitwise what the chat over the real prefill computes. `draft_reference` keeps the token ids the
rows were prefilled from: the speculative decoder drafts quotes of the document from them.

Composition: several cartridges served together are written one after another into one cache. Every
part keeps the rotations it was built at (its keys are frozen vectors), and the chat's tokens follow at
position composed_rows(parts). Two parts cut from one joint prefill compose back into exactly that
prefill's cache.

A hybrid model's memory (engine.kv.recurrent) also holds a recurrent state, which has read every position:
its cartridge keeps the attention layers' rows and the state after the document, one snapshot of the whole
prefix. Such cartridges do not compose (a state cannot be placed after another document's): one is served
alone, and its end is a mark the chat can rewind to.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.errors import ContextFull, InvalidPrefix, KvCacheShapeMismatch
from engine.kv.cache import KvCache, KvDtype


@dataclass
class Cartridge:
    k: list[np.ndarray]  # per layer [rows, kv_heads, row width] in the cache's storage form
    v: list[np.ndarray]
    dtype: KvDtype
    draft_reference: np.ndarray  # int64: the token ids behind the rows
    fingerprint: bytes  # the model's (engine.kv.persist.model_fingerprint)
    document: str  # SHA-256 (hex) of the document's text
    head_dims: tuple[int, ...]  # per layer (a q8_0 row's width is in blocks, not elements)
    name: str = ""  # the document's file name
    model: str = ""  # the model file's name, for the library's list (the fingerprint is what is checked)
    # a hybrid model's recurrent state after the prefix (a StateStore save: conv windows, delta-rule states) and
    # its layers' shapes; None and () for a memory of rows only
    state: tuple[list[np.ndarray], list[np.ndarray]] | None = None
    state_shapes: tuple = ()

    @classmethod
    def from_cache(cls, cache: KvCache, tokens: Sequence[int], fingerprint: bytes, document: str,
                   name: str = "", model: str = "") -> "Cartridge":
        """The rows [0, cache.len) of a cache that a prefill of `tokens` filled."""
        if len(tokens) != cache.len:
            raise ValueError(f"{len(tokens)} tokens do not describe the cache's {cache.len} rows")
        k = [cache.read_rows(layer, 0, cache.len)[0].copy() for layer in range(cache.n_layers)]
        v = [k[layer] if cache.value_is_key[layer] else cache.read_rows(layer, 0, cache.len)[1].copy()
             for layer in range(cache.n_layers)]  # a layer whose V rows are its K rows keeps them once
        state = cache.state_store.save() if cache.state_shapes else None  # copies
        return cls(k, v, cache.dtype, np.asarray(tokens, dtype=np.int64), fingerprint, document, cache.head_dims,
                   name, model, state, tuple(cache.state_shapes))

    @property
    def rows(self) -> int:
        return len(self.draft_reference)

    @property
    def id(self) -> str:
        return cartridge_id(self.document, self.fingerprint, self.dtype)

    def geometry(self) -> tuple:
        """As KvCache.geometry: (dtype, kv_heads per layer, head_dim per layer)."""
        return (self.dtype.value, tuple(k.shape[1] for k in self.k), tuple(self.head_dims))

    def byte_size(self) -> int:
        state = [] if self.state is None else [*self.state[0], *self.state[1]]
        return sum(a.nbytes for a in {id(a): a for a in self.k + self.v + state}.values())  # shared rows once

    def append_to_cache(self, cache: KvCache) -> None:
        """Write the rows at the cache's end and advance it past them."""
        if cache.geometry() != self.geometry() or tuple(cache.state_shapes) != self.state_shapes:
            raise KvCacheShapeMismatch(f"the cartridge of {self.name or self.document[:16]} was built for another "
                                       f"cache type or model geometry than this chat's")
        end = cache.len + self.rows
        if end > cache.capacity:
            raise ContextFull(f"the attached documents take {end} positions but the chat's context holds "
                              f"{cache.capacity}")
        if self.state is not None and cache.len:
            raise InvalidPrefix("a hybrid model's cartridge is a whole prefix: it starts an empty cache")
        for layer, (k, v) in enumerate(zip(self.k, self.v)):
            cache.write_rows(layer, cache.len, k, v)
        cache.len = end
        if self.state is not None:  # the state after the document, a mark the chat can rewind to
            cache.resume([(end, self.state)])


def cartridge_id(document: str, fingerprint: bytes, dtype: KvDtype) -> str:
    """What names a cartridge on disk: the document's hash, the model and the cache type."""
    return f"{document[:16]}-{fingerprint.hex()[:12]}-{KvDtype(dtype).value}"


def composed_rows(parts: Sequence[Cartridge]) -> int:
    return sum(p.rows for p in parts)


def write_composed(parts: Sequence[Cartridge], cache: KvCache) -> None:
    """Serve `parts` in order from an empty cache: afterwards it holds composed_rows(parts) positions. Every
    part must fit the cache's geometry and the model; nothing is written when one does not."""
    if not cache.composable and len(parts) > 1:  # engine.kv.memory: a state cannot follow another document's
        raise not_composable(len(parts))
    if cache.len:
        raise InvalidPrefix(f"cartridges are written into an empty KV cache; this one holds {cache.len} positions")
    if not parts:
        raise InvalidPrefix("a composition needs at least one cartridge")
    if len({p.fingerprint for p in parts}) != 1:
        raise KvCacheShapeMismatch("the attached documents' cartridges were built for different models")
    if composed_rows(parts) > cache.capacity:
        raise ContextFull(f"the attached documents take {composed_rows(parts)} positions but the chat's context "
                          f"holds {cache.capacity}; attach fewer or use a larger context")
    try:
        for part in parts:
            part.append_to_cache(cache)
    except BaseException:
        cache.reset()
        raise


def not_composable(count: int) -> InvalidPrefix:
    """The refusal of `count` documents on a model whose memory takes one cartridge (a hybrid's); the advice
    first, where a document's chip shows the start of it."""
    return InvalidPrefix(f"attach one document at a time: this model keeps a recurrent state, which cannot be "
                         f"composed from {count} documents' cartridges")


def composition_identity(parts: Sequence[Cartridge]) -> bytes:
    """SHA-256 naming a composition: which cartridges, in which order. A sidecar saved behind one prefix
    is resumed behind that prefix only."""
    h = hashlib.sha256(b"fucina-prefix-1")
    for p in parts:
        h.update(p.fingerprint + p.dtype.value.encode() + bytes.fromhex(p.document))
    return h.digest()

