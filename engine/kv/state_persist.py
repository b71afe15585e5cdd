"""A hybrid model's recurrent state saved beside its KV sidecar (engine.kv.persist): the checkpoint file
`<sidecar>.state`, so a Qwen3.5 chat reopens warm too.

The state holds every position it has read at once, so it is saved whole, at a turn's end (the position the
KV records then reach), and a reopened chat resumes at that checkpoint: its KV records up to the position, the
state as it was there, and the tokens after it read again (none, unless the KV records went further).

Byte layout (format 5, as the KV sidecar's), little-endian:

    off  size
    0    8     magic b"FUXST005"
    8    32    model fingerprint (the sidecar's)
    40   8     u64 position: how many positions the state has read
    48   32    SHA-256 of the token ids behind positions [0, position) (u32 each): the history it read
    80   4     u32 n_layers (the state's)
    84   20*n  per layer: u32 conv rows, conv channels, value heads, head size, head size
    ..         the layers' conv windows then delta-rule states, float32
    end-4 4    u32 CRC-32 of everything before it

Integrity. The file is written whole to a temporary file, fsynced, and renamed over the old one, so a
checkpoint is the old one or the new one, never a mix. A checkpoint is resumed only if its CRC verifies, its
fingerprint and shapes are this model's and cache's, and its position and token hash match the KV records
resumed with it (a sidecar rewound and rewritten after an edit holds another history there): a damaged or
stale checkpoint is never resumed, and the chat is read again instead.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

MAGIC = b"FUXST005"
_HEAD = struct.Struct("<8s32sQ32sI")
_SHAPE = struct.Struct("<5I")


def state_path(sidecar) -> str:
    return os.fspath(sidecar) + ".state"


def tokens_digest(tokens: Sequence[int]) -> bytes:
    return hashlib.sha256(np.asarray(tokens, dtype="<u4").tobytes()).digest()


def encode(fingerprint: bytes, tokens: Sequence[int], arrays: tuple[list[np.ndarray], list[np.ndarray]]) -> bytes:
    """A checkpoint of the state `arrays` (a StateStore save(): conv windows, delta-rule states) after reading
    `tokens` (the ids behind positions [0, len(tokens)))."""
    conv, ssm = arrays
    body = _HEAD.pack(MAGIC, fingerprint, len(tokens), tokens_digest(tokens), len(conv))
    body += b"".join(_SHAPE.pack(*c.shape, *s.shape) for c, s in zip(conv, ssm))
    body += b"".join(np.ascontiguousarray(a, dtype="<f4").tobytes() for a in [*conv, *ssm])
    return body + struct.pack("<I", zlib.crc32(body))


@dataclass
class StateUpdate:
    """A checkpoint to write beside a sidecar (off the decoding thread, after the KV records it goes with)."""
    checkpoint: bytes

    def write_to(self, sidecar) -> bool:
        write(state_path(sidecar), self.checkpoint)
        return True


def write(path, checkpoint: bytes) -> None:
    """Replace the checkpoint file at `path` with `checkpoint`, atomically (a crash leaves the old or the new;
    two processes writing it leave one whole file)."""
    path = os.fspath(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(checkpoint)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def read(path, fingerprint: bytes, shapes: Sequence[tuple[tuple[int, int], tuple[int, int, int]]],
         tokens: Sequence[int]) -> tuple[int, tuple[list[np.ndarray], list[np.ndarray]]] | None:
    """The checkpoint at `path` if it is whole and belongs here: (its position, its arrays), its position at
    most len(tokens) and the tokens before it those it read; else None. Never raises on a file's contents."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if len(data) < _HEAD.size + 4 or struct.unpack("<I", data[-4:])[0] != zlib.crc32(data[:-4]):
        return None
    magic, stored_fingerprint, position, digest, n_layers = _HEAD.unpack_from(data)
    if magic != MAGIC or stored_fingerprint != fingerprint or n_layers != len(shapes):
        return None
    if position > len(tokens) or digest != tokens_digest(tokens[:position]):
        return None
    offset = _HEAD.size
    for conv, ssm in shapes:
        if _SHAPE.unpack_from(data, offset) != (*conv, *ssm):
            return None
        offset += _SHAPE.size
    sizes = [int(np.prod(c)) for c, _ in shapes] + [int(np.prod(s)) for _, s in shapes]
    if offset + 4 * sum(sizes) + 4 != len(data):
        return None
    flat = np.frombuffer(data, "<f4", sum(sizes), offset)
    arrays, start = [], 0
    for n, shape in zip(sizes, [c for c, _ in shapes] + [s for _, s in shapes]):
        arrays.append(flat[start:start + n].reshape(shape).astype(np.float32))
        start += n
    return position, (arrays[:len(shapes)], arrays[len(shapes):])
