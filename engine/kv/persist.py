"""Crash-safe append-only KV sidecar: a conversation reopens warm, with zero re-prefill (spec 13.4 kv_persist).

Byte layout, little-endian. Header:

    off  size
    0    8     magic b"FUXKV001" (b"FUXKV002" when the file carries a preloaded prefix)
    8    8     u64 record count                       } published together, one 12-byte write,
    16   4     u32 CRC-32 of the header, this field 0 } after the records they cover
    20   32    model fingerprint (model_fingerprint: SHA-256)
    52   4     u32 dtype (0 = f16, 1 = q8_0)
    56   4     u32 n_layers
    60   8*n   per layer: u32 kv_heads, u32 row bytes (one head's row: head_dim*2 for f16, 34 per 32 for q8_0)
    [V2  8     u64 prefix_rows, > 0]

then one record per cache position: u32 token id (0xFFFFFFFF for a prefix row, which has no token), then per
layer its K rows (kv_heads * row bytes) and its V rows, in storage form. bytes_per_token(cache) is the record
size. Prefix-free conversations write V1 files; a V2 file holds a record for every position, prefix included.

Records are written and fsynced before the count that covers them, so a torn append is invisible; the checksum
makes a damaged header (the count included) refuse the file rather than misload it. The fingerprint refuses a
sidecar of another model with the same geometry.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.errors import KvPersistTokenMismatch
from engine.kv.cache import KvCache, KvDtype

MAGIC_V1, MAGIC_V2 = b"FUXKV001", b"FUXKV002"
PREFIX_TOKEN = 0xFFFFFFFF
_DTYPE_CODES = {KvDtype.F16: 0, KvDtype.Q8_0: 1}
_COUNT = struct.Struct("<QI")  # record count, header CRC (at offset 8)
_FIXED = struct.Struct("<32sII")  # fingerprint, dtype, n_layers (at offset 20)
_SAMPLES, _SAMPLE_BYTES = 16, 4096


@dataclass
class Loaded:
    tokens: list[int]  # the tokens behind positions [prefix_rows, cache.len)
    prefix_rows: int


def model_fingerprint(gguf) -> bytes:
    """SHA-256 of a GGUF's header (metadata and tensor directory), its size, and 16 evenly spaced 4 KiB
    samples of its tensor data: a few MB read even for a large model, and a fine-tune that shares the
    base model's header still differs."""
    data_start = min((t.offset for t in gguf.tensors.values()), default=gguf.file_size())
    size = gguf.file_size()
    h = hashlib.sha256(struct.pack("<Q", size))
    with open(gguf.path, "rb") as f:
        h.update(f.read(data_start))
        span = max(size - data_start - _SAMPLE_BYTES, 0)
        for i in range(_SAMPLES):
            f.seek(data_start + span * i // (_SAMPLES - 1))
            h.update(f.read(_SAMPLE_BYTES))
    return h.digest()


def bytes_per_token(cache: KvCache) -> int:
    return _record_dtype(cache).itemsize


def header_size(cache: KvCache, prefix_rows: int = 0) -> int:
    return len(_header(cache, bytes(32), prefix_rows, 0))


def reset(path, cache: KvCache, fingerprint: bytes, prefix_rows: int = 0) -> None:
    """Start the sidecar over, empty, for this cache's geometry, this model and prefix shape."""
    _reset_to(path, _header(cache, fingerprint, prefix_rows, 0))


def _reset_to(path, empty_header: bytes) -> None:
    with open(path, "wb") as f:
        f.write(empty_header)
        _sync(f)


def append_range(path, cache: KvCache, tokens: Sequence[int], fingerprint: bytes, prefix_rows: int = 0) -> None:
    """Bring the sidecar up to the cache: write the positions it does not hold yet. `tokens` are the tokens
    behind positions [prefix_rows, cache.len). A missing, foreign or differently prefixed file, or one that
    holds more positions than the cache, starts over. The caller rewinds the file (rewind) when the cache
    dropped positions the file holds."""
    held = _held_at(path, cache, fingerprint, prefix_rows)
    start = 0 if held is None or held > cache.len else held
    apply(path, snapshot(cache, tokens, fingerprint, prefix_rows, start))


@dataclass
class Update:
    """Positions [start, count) of a sidecar, copied out of the KV cache, so they can be written later (off
    the decoding thread) while the cache moves on."""
    start: int
    records: np.ndarray  # start..count as sidecar records
    header: bytes        # the header publishing `count` positions

    @property
    def count(self) -> int:
        return self.start + len(self.records)


def snapshot(cache: KvCache, tokens: Sequence[int], fingerprint: bytes, prefix_rows: int, start: int) -> Update:
    """Copy positions [start, cache.len) out of the cache. `tokens` are the tokens behind positions
    [prefix_rows, cache.len)."""
    if prefix_rows + len(tokens) != cache.len:
        raise KvPersistTokenMismatch(f"{prefix_rows} prefix rows + {len(tokens)} tokens do not describe the "
                                     f"{cache.len} positions of the KV cache")
    if not 0 <= start <= cache.len:
        raise ValueError(f"a snapshot starts inside the cache's {cache.len} positions, got {start}")
    return Update(start, _records(cache, tokens, prefix_rows, start), _header(cache, fingerprint, prefix_rows,
                                                                              cache.len))


def apply(path, update: Update) -> bool:
    """Make the sidecar hold the positions it held before `update.start`, then the update's. A file that
    is not this conversation's starts over when the update starts at 0. False, with the file untouched, when
    the file holds fewer than `update.start` positions (it was lost or damaged: write a snapshot from 0)."""
    empty = _with_count(update.header, 0)
    held = _held_at_header(path, empty, update.records.dtype.itemsize)
    if held is None and update.start == 0:
        _reset_to(path, empty)
        held = 0
    if held is None or held < update.start:
        return False
    with open(path, "r+b") as f:
        if held > update.start:  # unpublish the replaced positions before overwriting them
            f.seek(8)
            f.write(_with_count(update.header, update.start)[8:20])
            _sync(f)
        end = len(empty) + update.count * update.records.dtype.itemsize
        if update.records.size or f.seek(0, os.SEEK_END) != end:
            f.seek(len(empty) + update.start * update.records.dtype.itemsize)
            f.write(update.records.tobytes())
            f.truncate()  # a torn tail past the new end
            _sync(f)
        f.seek(8)
        f.write(update.header[8:20])
        _sync(f)
    return True


def rewind(path, cache: KvCache, fingerprint: bytes, positions: int, prefix_rows: int = 0) -> None:
    """Keep only the first `positions` records (the cache was rewound past them); a file that holds no more,
    or is not this conversation's, is left as it is."""
    held = _held_at(path, cache, fingerprint, prefix_rows)
    if held is not None and held > positions:
        with open(path, "r+b") as f:
            f.seek(8)
            f.write(_header(cache, fingerprint, prefix_rows, positions)[8:20])
            _sync(f)


def load(path, cache: KvCache, fingerprint: bytes) -> Loaded | None:
    """Resume a saved conversation into `cache`: its positions replace the cache's contents. Applies up to
    the stored count, stopping early at a torn tail. None, with the cache untouched, when nothing usable is
    there: no file, another geometry or model, a damaged header, no records, a tear inside the prefix, a
    history beyond the cache's capacity. Never raises on a file's contents."""
    v1_size = len(_header(cache, fingerprint, 0, 0))  # V2 adds prefix_rows right after V1's header
    try:
        with open(path, "rb") as f:
            magic = f.read(8)
            f.seek(v1_size)
            prefix_rows = int.from_bytes(f.read(8).ljust(8, b"\0"), "little") if magic == MAGIC_V2 else 0
            if magic not in (MAGIC_V1, MAGIC_V2) or (magic == MAGIC_V2) != (prefix_rows > 0):
                return None
            held = _held(f, _header(cache, fingerprint, prefix_rows, 0), bytes_per_token(cache))
            if not held or held < prefix_rows or _count(f) > cache.capacity:
                return None
            f.seek(len(_header(cache, fingerprint, prefix_rows, 0)))
            data = f.read(held * bytes_per_token(cache))
    except OSError:
        return None
    if len(data) != held * bytes_per_token(cache):  # the file shrank while we read it
        return None
    records = np.frombuffer(data, _record_dtype(cache), held)
    tokens = records["token"]
    if np.any(tokens[:prefix_rows] != PREFIX_TOKEN) or np.any(tokens[prefix_rows:] == PREFIX_TOKEN):
        return None
    for layer in range(cache.n_layers):
        cache.k[layer][:held] = records[f"k{layer}"]
        cache.v[layer][:held] = records[f"v{layer}"]
    cache.len = held
    return Loaded([int(t) for t in tokens[prefix_rows:]], prefix_rows)


def _header(cache: KvCache, fingerprint: bytes, prefix_rows: int, count: int) -> bytes:
    if len(fingerprint) != 32 or prefix_rows < 0:
        raise ValueError("a sidecar needs a 32-byte model fingerprint and a non-negative prefix_rows")
    body = _FIXED.pack(fingerprint, _DTYPE_CODES[cache.dtype], cache.n_layers)
    body += b"".join(struct.pack("<II", k.shape[1], k.shape[2] * k.itemsize) for k in cache.k)
    if prefix_rows:
        body += struct.pack("<Q", prefix_rows)
    return _with_count((MAGIC_V2 if prefix_rows else MAGIC_V1) + _COUNT.pack(0, 0) + body, count)


def _with_count(header: bytes, count: int) -> bytes:
    """The header publishing `count` positions (its CRC covers the count)."""
    magic, body = header[:8], header[20:]
    crc = zlib.crc32(magic + _COUNT.pack(count, 0) + body)
    return magic + _COUNT.pack(count, crc) + body


def _count(f) -> int:
    f.seek(8)
    return _COUNT.unpack(f.read(_COUNT.size))[0]


def _held_at(path, cache: KvCache, fingerprint: bytes, prefix_rows: int) -> int | None:
    return _held_at_header(path, _header(cache, fingerprint, prefix_rows, 0), bytes_per_token(cache))


def _held_at_header(path, empty_header: bytes, record_size: int) -> int | None:
    try:
        with open(path, "rb") as f:
            return _held(f, empty_header, record_size)
    except OSError:
        return None


def _held(f, empty_header: bytes, record_size: int) -> int | None:
    """How many complete records a sidecar with this header (geometry, model and prefix shape) publishes
    (its count, or fewer at a torn tail); None for another one's, or a damaged header."""
    size = f.seek(0, os.SEEK_END)
    f.seek(0)
    stored = f.read(len(empty_header))
    if len(stored) < 20:
        return None
    count = _COUNT.unpack(stored[8:20])[0]
    if stored != _with_count(empty_header, count):  # the CRC covers the count too
        return None
    return min(count, (size - len(stored)) // record_size)


def _record_dtype(cache: KvCache) -> np.dtype:
    fields = [("token", "<u4")]
    for layer, (k, v) in enumerate(zip(cache.k, cache.v)):
        fields += [(f"k{layer}", k.dtype.newbyteorder("<"), k.shape[1:]),
                   (f"v{layer}", v.dtype.newbyteorder("<"), v.shape[1:])]
    return np.dtype(fields)


def _records(cache: KvCache, tokens: Sequence[int], prefix_rows: int, start: int) -> np.ndarray:
    """Positions [start, cache.len) as sidecar records."""
    out = np.empty(cache.len - start, _record_dtype(cache))
    ids = np.full(cache.len, PREFIX_TOKEN, dtype=np.uint32)
    ids[prefix_rows:] = tokens
    out["token"] = ids[start:]
    for layer in range(cache.n_layers):
        out[f"k{layer}"] = cache.k[layer][start:cache.len]
        out[f"v{layer}"] = cache.v[layer][start:cache.len]
    return out


def _sync(f) -> None:
    f.flush()
    os.fsync(f.fileno())
