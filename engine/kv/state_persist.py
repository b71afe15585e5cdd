"""A hybrid model's recurrent state saved beside its KV sidecar (engine.kv.persist): the checkpoint file
`<sidecar>.state`, so a Qwen3.5 chat reopens warm too.

The state holds every position it has read at once, so it is saved whole, at a turn's end: the memory's two
newest marks (engine.kv.recurrent), the turn's end and its prompt but the last token. A reopened chat resumes
at the newest checkpoint its KV records reach, the other kept as a mark: a history re-rendered otherwise than
it was read (a reply whose text tokenizes otherwise than it was sampled) rewinds to the prompt's and reads the
reply again, not the whole chat.

Byte layout (format 5, as the KV sidecar's), little-endian:

    off  size
    0    8     magic b"FUXST005"
    8    32    model fingerprint (the sidecar's)
    40   4     u32 n_layers (the state's)
    44   20*n  per layer: u32 conv rows, conv channels, value heads, head size, head size
    ..   4     u32 checkpoints, then each:
               u64 position: how many positions the state has read
               32  SHA-256 of the token ids behind positions [0, position) (u32 each): the history it read
               the layers' conv windows then delta-rule states, float32
    end-4 4    u32 CRC-32 of everything before it

Integrity. The file is written whole to a temporary file, fsynced, and renamed over the old one, so the
checkpoints are the old ones or the new ones, never a mix. A checkpoint is resumed only if the file's CRC
verifies, its fingerprint and shapes are this model's and cache's, and its position and token hash match the
KV records resumed with it (a sidecar rewound and rewritten after an edit holds another history there): a
damaged or stale checkpoint is never resumed, and the chat is read again instead.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.kv import crc

MAGIC = b"FUXST005"
_HEAD = struct.Struct("<8s32sI")
_SHAPE = struct.Struct("<5I")
_CHECKPOINT = struct.Struct("<Q32s")
_COUNT = struct.Struct("<I")

Arrays = tuple[list[np.ndarray], list[np.ndarray]]  # a StateStore save(): conv windows, delta-rule states
Shapes = Sequence[tuple[tuple[int, int], tuple[int, int, int]]]


def state_path(sidecar) -> str:
    return os.fspath(sidecar) + ".state"


def tokens_digest(tokens: Sequence[int]) -> bytes:
    return hashlib.sha256(np.asarray(tokens, dtype="<u4").tobytes()).digest()


def encode(fingerprint: bytes, shapes: Shapes, tokens: Sequence[int],
           checkpoints: Sequence[tuple[int, Arrays]]) -> bytes:
    """A file of the state `checkpoints` ((position, arrays of `shapes`), each having read tokens[:position])."""
    body = _HEAD.pack(MAGIC, fingerprint, len(shapes))
    body += b"".join(_SHAPE.pack(*conv, *ssm) for conv, ssm in shapes)
    body += _COUNT.pack(len(checkpoints))
    for position, (conv, ssm) in checkpoints:
        body += _CHECKPOINT.pack(position, tokens_digest(tokens[:position]))
        body += b"".join(np.ascontiguousarray(a, dtype="<f4").tobytes() for a in [*conv, *ssm])
    return body + struct.pack("<I", crc.crc32(body))


@dataclass
class StateUpdate:
    """Checkpoints to write beside a sidecar, encoded and written off the decoding thread, after the KV records
    they go with (the states are copies no one changes: a memory's marks)."""
    fingerprint: bytes
    shapes: Shapes
    tokens: list[int]
    checkpoints: list[tuple[int, Arrays]]

    def write_to(self, sidecar) -> bool:
        write(state_path(sidecar), encode(self.fingerprint, self.shapes, self.tokens, self.checkpoints))
        return True


def write(path, data: bytes) -> None:
    """Replace the checkpoint file at `path` with `data`, atomically (a crash leaves the old or the new; two
    processes writing it leave one whole file)."""
    path = os.fspath(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _contents(path) -> bytes | mmap.mmap:
    """The file's bytes, mapped where the platform lets a mapped file be replaced: the states found are views of
    the page cache's copy, no buffer of the file's size faulted in and filled at every reopen (Windows cannot
    replace a mapped file, and a resumed chat keeps its marks, views of it, until it writes the next one)."""
    with open(path, "rb") as f:
        return f.read() if os.name == "nt" else mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def read(path, fingerprint: bytes, shapes: Shapes, tokens: Sequence[int]) -> list[tuple[int, Arrays]]:
    """The checkpoints at `path` that belong here, oldest first: of a whole file of this model and shapes,
    those at most len(tokens) positions in whose tokens before them are those they read ([] for none). Never
    raises on a file's contents."""
    try:
        data = _contents(path)
    except (OSError, ValueError):  # ValueError: an empty file, which cannot be mapped
        return []
    if len(data) < _HEAD.size + 4 or struct.unpack("<I", data[-4:])[0] != crc.crc32(memoryview(data)[:-4]):
        return []
    magic, stored_fingerprint, n_layers = _HEAD.unpack_from(data)
    if magic != MAGIC or stored_fingerprint != fingerprint or n_layers != len(shapes):
        return []
    offset = _HEAD.size
    for conv, ssm in shapes:
        if _SHAPE.unpack_from(data, offset) != (*conv, *ssm):
            return []
        offset += _SHAPE.size
    layouts = [c for c, _ in shapes] + [s for _, s in shapes]
    floats = sum(int(np.prod(shape)) for shape in layouts)
    (count,) = _COUNT.unpack_from(data, offset)
    offset += _COUNT.size
    if offset + count * (_CHECKPOINT.size + 4 * floats) + 4 != len(data):
        return []
    found = []
    for _ in range(count):
        position, digest = _CHECKPOINT.unpack_from(data, offset)
        offset += _CHECKPOINT.size
        flat = np.frombuffer(data, "<f4", floats, offset)
        offset += 4 * floats
        if position > len(tokens) or digest != tokens_digest(tokens[:position]):
            continue
        arrays, start = [], 0
        for shape in layouts:  # read-only views of the file's bytes: a state is only ever copied from
            n = int(np.prod(shape))
            arrays.append(flat[start:start + n].reshape(shape))
            start += n
        found.append((position, (arrays[:len(shapes)], arrays[len(shapes):])))
    return sorted(found, key=lambda c: c[0])
