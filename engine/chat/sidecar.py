"""A conversation's KV sidecar (engine.kv.persist): the file that keeps a chat's cache between processes.

Opened once, before the chat's first turn: a file this model saved behind the same attached documents
resumes (its tokens and KV rows, the prefix included; zero re-prefill), any other starts over. From then on,
every turn's end brings the file up to the cache: the positions from the first one the cache replaced or
added since the last save are copied out there and written by the background writer
(engine.kv.sidecar_writer), so the disk never stalls a reply. A hybrid model's memory adds its recurrent
state, saved whole at every turn's end beside the file (engine.kv.state_persist): a reopened hybrid chat
resumes at the newest checkpoint whose history the KV records hold, and reads again whatever follows it.
"""

from __future__ import annotations

import hashlib
import os
from typing import Sequence

from engine.gguf.reader import GGUFFile
from engine.kv import persist as kv_persist
from engine.kv import state_persist
from engine.kv.cache import KvCache
from engine.kv.sidecar_writer import WRITER


class Sidecar:
    """One conversation's sidecar file, and how much of the conversation's cache it holds."""

    def __init__(self, path: str, fingerprint: bytes, saved: int):
        self.path, self.fingerprint = path, fingerprint
        self.saved = saved  # leading cache positions the file holds (or will, once its writes land)
        self.saved_marks: list = []  # a hybrid's: the state checkpoints beside it (_checkpoints)
        self.error: str | None = None  # why the last write failed; the next save rewrites the file whole

    @classmethod
    def open(cls, path: str | os.PathLike, model_file: GGUFFile, prefix_identity: bytes | None, cache: KvCache,
             prefix_rows: int) -> tuple[Sidecar, kv_persist.Loaded | None]:
        """The sidecar at `path` and what it resumed into `cache`: None when the file held nothing of this
        chat and was started over behind the cache's `prefix_rows`."""
        fingerprint = kv_persist.model_fingerprint(model_file)
        if prefix_identity is not None:  # behind cartridges: the file is this model's AND this prefix's
            fingerprint = hashlib.sha256(fingerprint + prefix_identity).digest()
        WRITER.flush()  # another conversation over this file may still be writing it
        loaded = kv_persist.load(path, cache, fingerprint)
        if loaded is not None and cache.state_store is not None:
            loaded = _resume_state(path, cache, fingerprint, loaded)
        if loaded is None:  # a stale or foreign file must not become this conversation's
            kv_persist.reset(path, cache, fingerprint, prefix_rows)
        # A fresh file holds nothing yet: the first save writes from position 0, a declared prefix's rows
        # included (starting at cache.len would leave the prefix unwritten and every later append refused).
        sidecar = cls(os.fspath(path), fingerprint, 0 if loaded is None else cache.len)
        if loaded is not None and cache.state_store is not None:  # what the checkpoint file holds
            sidecar.saved_marks = _checkpoints(loaded.tokens, [p for p, _ in _saved_marks(cache, prefix_rows)])
        return sidecar, loaded

    def rewind(self, positions: int) -> None:
        """The cache now holds only its first `positions`: the next save writes from there at the latest."""
        self.saved = min(self.saved, positions)

    def save(self, cache: KvCache, tokens: Sequence[int], prefix_rows: int) -> None:
        """Hand the writer the positions the file lacks (all of them after a failed write); `tokens` are the
        ones behind the cache's positions [prefix_rows, cache.len)."""
        self.error = WRITER.take_failure(self.path)
        start = 0 if self.error else self.saved
        WRITER.submit(self.path, kv_persist.snapshot(cache, tokens, self.fingerprint, prefix_rows, start))
        if cache.state_store is not None:  # after the KV records they go with (the writer keeps the order)
            marks = _saved_marks(cache, prefix_rows)
            held = _checkpoints(tokens, [p for p, _ in marks])
            if self.error or held != self.saved_marks:
                WRITER.submit(self.path, state_persist.StateUpdate(self.fingerprint, cache.state_shapes,
                                                                   list(tokens), marks))
            self.saved_marks = held
        self.saved = cache.len


def _checkpoints(tokens: Sequence[int], positions: Sequence[int]) -> list[tuple[int, bytes]]:
    """What names a set of state checkpoints: each one's position and the history it read."""
    return [(p, state_persist.tokens_digest(tokens[:p])) for p in positions]


def _saved_marks(cache: KvCache, prefix_rows: int) -> list[tuple[int, object]]:
    """The marks a checkpoint file keeps, at positions counted from the end of the prefix (a cartridge's, whose
    tokens the file does not hold): the history each one read is tokens[:position]."""
    return [(p - prefix_rows, state) for p, state in cache.saved_marks() if p >= prefix_rows]


def _resume_state(path, cache: KvCache, fingerprint: bytes, loaded: kv_persist.Loaded) -> kv_persist.Loaded | None:
    """The loaded KV records cut back to the newest state checkpoint that goes with them, the state loaded (and
    the others marked); None without one, the cache back to its prefix (a cartridge's rows and state, a mark):
    a hybrid chat cannot resume its KV records alone."""
    prefix = loaded.prefix_rows
    found = state_persist.read(state_persist.state_path(path), fingerprint, cache.state_shapes, loaded.tokens)
    if not found:
        if cache.can_truncate(prefix):
            cache.truncate(prefix)
        else:
            cache.reset()
        return None
    cache.resume([(prefix + p, state) for p, state in found])
    return kv_persist.Loaded(loaded.tokens[: cache.len - prefix], prefix)
