"""Crash-safe append-only KV sidecar: a conversation reopens warm, with zero re-prefill (spec 13.4 kv_persist).

Byte layout (format 5), little-endian. Header:

    off  size
    0    8     magic b"FUXKV005"
    8    8     u64 record count                       } published together, one 12-byte write,
    16   4     u32 CRC-32 of the header, this field 0 } after the records they cover
    20   32    model fingerprint (model_fingerprint: SHA-256)
    52   4     u32 dtype (0 = f16, 1 = q8_0)
    56   4     u32 n_layers
    60   8*n   per layer: u32 kv_heads, u32 row bytes (one head's row: head_dim*2 for f16, 34 per 32 for q8_0);
               kv_heads' top bit set: the layer's V rows are its K rows (latent attention), stored once
    60+8n 4    u32 state layers (a hybrid model's recurrent layers, whose state is saved beside the file,
               engine.kv.state_persist; 0 for the others), then per state layer u32 conv floats, u32 state
               floats
    ..    8    u64 prefix_rows (0 without a preloaded prefix)

then one record per cache position, prefix included: u32 token id (0xFFFFFFFF for a prefix row, which has no
token), then per layer its K rows (kv_heads * row bytes) and its V rows (none where they are the K rows), in
storage form, then a u32 CRC-32 of the record's other bytes, started from the record's position
(zlib.crc32(bytes, position)), so a record moved to another position fails too. bytes_per_token(cache) is the
record size: 8 + the layers' (2, or 1 where V is K) * kv_heads * row bytes.

Integrity. Records are written and fsynced before the count that covers them, so a torn append is
invisible; the header CRC refuses a damaged header (the count included) rather than misload it; the
fingerprint refuses a sidecar of another model with the same geometry. load verifies the records' CRCs in
order and resumes the verified prefix: the first damaged record and everything after it are never resumed.
A damaged or torn record inside the preloaded prefix resumes nothing (the prefix is all or nothing). The
next save rewrites the file from the end of what was resumed. Files of formats 1 to 4 (FUXKV001/002: no
record CRCs; FUXKV003: no latent flag; FUXKV004: no state layers) are refused like any foreign file: the
conversation is prefilled again and the file rewritten.

Two processes on one file: every read and write of the file holds an exclusive lock on it (file_lock), so
their writes never interleave; and an update only extends a file whose last record before it is the one
the update's cache holds there, so a file another process rewrote with another history is written whole
again rather than completed with this one's positions.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Sequence

import numpy as np

from engine.errors import KvPersistTokenMismatch
from engine.kv.cache import KvCache, KvDtype
from engine.kv.crc import map_halves
from engine.kv.file_lock import locked

MAGIC = b"FUXKV005"
PREFIX_TOKEN = 0xFFFFFFFF
_DTYPE_CODES = {KvDtype.F16: 0, KvDtype.Q8_0: 1}
_COUNT = struct.Struct("<QI")  # record count, header CRC (at offset 8)
_FIXED = struct.Struct("<32sII")  # fingerprint, dtype, n_layers (at offset 20)
_CRC = 4  # bytes of a record's trailing CRC
_VALUE_IS_KEY = 1 << 31  # in a layer's kv_heads field
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


def header_size(cache: KvCache) -> int:
    return len(_header(cache, bytes(32), 0, 0))


def reset(path, cache: KvCache, fingerprint: bytes, prefix_rows: int = 0) -> None:
    """Start the sidecar over, empty, for this cache's geometry, this model and prefix shape."""
    empty = _header(cache, fingerprint, prefix_rows, 0)
    with locked(path, create=True) as f:
        _reset_to(f, empty)


def _reset_to(f: BinaryIO, empty_header: bytes) -> None:
    f.seek(0)
    f.truncate()
    f.write(empty_header)
    _sync(f)


def append_range(path, cache: KvCache, tokens: Sequence[int], fingerprint: bytes, prefix_rows: int = 0) -> None:
    """Bring the sidecar up to the cache: write the positions it does not hold yet. `tokens` are the tokens
    behind positions [prefix_rows, cache.len). A missing, foreign or differently prefixed file, or one that
    holds more positions than the cache, starts over. The caller rewinds the file (rewind) when the cache
    dropped positions the file holds."""
    held = _held_at(path, cache, fingerprint, prefix_rows)
    start = 0 if held is None or held > cache.len else held
    if not apply(path, snapshot(cache, tokens, fingerprint, prefix_rows, start)):
        apply(path, snapshot(cache, tokens, fingerprint, prefix_rows, 0))  # it changed under us: start over


@dataclass
class Update:
    """Positions [start, count) of a sidecar, copied out of the KV cache, so they can be written later (off
    the decoding thread) while the cache moves on."""
    start: int
    records: np.ndarray  # start..count as sidecar records (their CRCs are filled in when written)
    header: bytes        # the header publishing `count` positions
    base: np.ndarray     # the record at start - 1 (none when start is 0): the file must hold it there

    @property
    def count(self) -> int:
        return self.start + len(self.records)

    def write_to(self, path) -> bool:
        return apply(path, self)


def snapshot(cache: KvCache, tokens: Sequence[int], fingerprint: bytes, prefix_rows: int, start: int) -> Update:
    """Copy positions [start, cache.len) out of the cache. `tokens` are the tokens behind positions
    [prefix_rows, cache.len)."""
    if prefix_rows + len(tokens) != cache.len:
        raise KvPersistTokenMismatch(f"{prefix_rows} prefix rows + {len(tokens)} tokens do not describe the "
                                     f"{cache.len} positions of the KV cache")
    if not 0 <= start <= cache.len:
        raise ValueError(f"a snapshot starts inside the cache's {cache.len} positions, got {start}")
    records = _records(cache, tokens, prefix_rows, max(start - 1, 0))
    base, records = (records[:1], records[1:]) if start else (records[:0], records)
    return Update(start, records, _header(cache, fingerprint, prefix_rows, cache.len), base)


def apply(path, update: Update) -> bool:
    """Make the sidecar hold the positions it held before `update.start`, then the update's. A file that
    is not this conversation's starts over when the update starts at 0. False, with the file untouched, when
    the file does not hold the update's first `update.start` positions (they were lost or damaged, or
    another process wrote another history there: write a snapshot from 0)."""
    empty = _with_count(update.header, 0)
    size = update.records.dtype.itemsize
    try:
        with locked(path, create=update.start == 0) as f:
            held = _held(f, empty, size)
            if held is None and update.start == 0:
                _reset_to(f, empty)
                held = 0
            if held is None or held < update.start or not _holds(f, len(empty), update.base, update.start - 1):
                return False
            if held > update.start:  # unpublish the replaced positions before overwriting them
                f.seek(8)
                f.write(_with_count(update.header, update.start)[8:20])
                _sync(f)
            end = len(empty) + update.count * size
            if update.records.size or f.seek(0, os.SEEK_END) != end:
                _seal(update.records, update.start)
                f.seek(len(empty) + update.start * size)
                f.write(update.records.tobytes())
                f.truncate()  # a torn tail past the new end
                _sync(f)
            f.seek(8)
            f.write(update.header[8:20])
            _sync(f)
    except FileNotFoundError:
        if not update.start:  # its directory is gone: an error to report
            raise
        return False  # the file went away, and with it the positions the update extends
    return True


def rewind(path, cache: KvCache, fingerprint: bytes, positions: int, prefix_rows: int = 0) -> None:
    """Keep only the first `positions` records (the cache was rewound past them); a file that holds no more,
    or is not this conversation's, is left as it is."""
    header = _header(cache, fingerprint, prefix_rows, positions)
    try:
        with locked(path) as f:
            held = _held(f, _with_count(header, 0), bytes_per_token(cache))
            if held is not None and held > positions:
                f.seek(8)
                f.write(header[8:20])
                _sync(f)
    except FileNotFoundError:
        pass


def load(path, cache: KvCache, fingerprint: bytes) -> Loaded | None:
    """Resume a saved conversation into `cache`: its positions replace the cache's contents. Applies the
    records whose CRCs verify, in order, up to the stored count: stopping at a torn tail or at the first
    damaged record. None, with the cache untouched, when nothing usable is there: no file, another format,
    geometry or model, a damaged header, no verified records, damage inside the prefix, a history beyond
    the cache's capacity. Never raises on a file's contents (KvSidecarLocked when another process keeps
    the file locked)."""
    size, header_len = bytes_per_token(cache), header_size(cache)
    try:
        with locked(path, write=False) as f:
            stored = f.read(header_len)
            if len(stored) != header_len or stored[:8] != MAGIC:
                return None
            prefix_rows = int.from_bytes(stored[-8:], "little")
            held = _held(f, _header(cache, fingerprint, prefix_rows, 0), size)
            if not held or held < prefix_rows or _COUNT.unpack(stored[8:20])[0] > cache.capacity:
                return None
            f.seek(header_len)
            data = f.read(held * size)
    except OSError:
        return None
    if len(data) != held * size:  # shrunk by a writer that ignores the lock
        return None
    records = np.frombuffer(data, _record_dtype(cache), held)
    records = records[:_verified(records)]
    tokens = records["token"]
    if len(records) < max(prefix_rows, 1) or np.any(tokens[:prefix_rows] != PREFIX_TOKEN) \
            or np.any(tokens[prefix_rows:] == PREFIX_TOKEN):
        return None
    for layer in range(cache.n_layers):
        k = records[f"k{layer}"]
        cache.write_rows(layer, 0, k, k if cache.value_is_key[layer] else records[f"v{layer}"])
    cache.len = len(records)
    return Loaded([int(t) for t in tokens[prefix_rows:]], prefix_rows)


def _header(cache: KvCache, fingerprint: bytes, prefix_rows: int, count: int) -> bytes:
    if len(fingerprint) != 32 or prefix_rows < 0:
        raise ValueError("a sidecar needs a 32-byte model fingerprint and a non-negative prefix_rows")
    body = _FIXED.pack(fingerprint, _DTYPE_CODES[cache.dtype], cache.n_layers)
    layouts = (cache.row_layout(layer) for layer in range(cache.n_layers))
    body += b"".join(struct.pack("<II", heads | (_VALUE_IS_KEY if shared else 0), width * dtype.itemsize)
                     for (dtype, (heads, width)), shared in zip(layouts, cache.value_is_key))
    body += struct.pack("<I", len(cache.state_shapes))
    body += b"".join(struct.pack("<II", int(np.prod(conv)), int(np.prod(ssm))) for conv, ssm in cache.state_shapes)
    body += struct.pack("<Q", prefix_rows)
    return _with_count(MAGIC + _COUNT.pack(0, 0) + body, count)


def _with_count(header: bytes, count: int) -> bytes:
    """The header publishing `count` positions (its CRC covers the count)."""
    magic, body = header[:8], header[20:]
    crc = zlib.crc32(magic + _COUNT.pack(count, 0) + body)
    return magic + _COUNT.pack(count, crc) + body


def _held_at(path, cache: KvCache, fingerprint: bytes, prefix_rows: int) -> int | None:
    try:
        with locked(path, write=False) as f:
            return _held(f, _header(cache, fingerprint, prefix_rows, 0), bytes_per_token(cache))
    except OSError:
        return None


def _held(f: BinaryIO, empty_header: bytes, record_size: int) -> int | None:
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


def _holds(f: BinaryIO, header_len: int, record: np.ndarray, position: int) -> bool:
    """Whether the file's record at `position` is `record` (trivially so for none)."""
    if not len(record):
        return True
    _seal(record, position)
    f.seek(header_len + position * record.dtype.itemsize)
    return f.read(record.dtype.itemsize) == record.tobytes()


def _record_dtype(cache: KvCache) -> np.dtype:
    fields = [("token", "<u4")]
    for layer in range(cache.n_layers):
        dtype, shape = cache.row_layout(layer)
        fields.append((f"k{layer}", dtype.newbyteorder("<"), shape))
        if not cache.value_is_key[layer]:
            fields.append((f"v{layer}", dtype.newbyteorder("<"), shape))
    return np.dtype(fields + [("crc", "<u4")])


def _records(cache: KvCache, tokens: Sequence[int], prefix_rows: int, start: int) -> np.ndarray:
    """Positions [start, cache.len) as sidecar records (CRCs not filled in yet)."""
    out = np.empty(cache.len - start, _record_dtype(cache))
    ids = np.full(cache.len, PREFIX_TOKEN, dtype=np.uint32)
    ids[prefix_rows:] = tokens
    out["token"] = ids[start:]
    for layer in range(cache.n_layers):
        k, v = cache.read_rows(layer, start, cache.len)
        out[f"k{layer}"] = k
        if not cache.value_is_key[layer]:
            out[f"v{layer}"] = v
    return out


def _crcs(raw: memoryview, size: int, first: int, n: int) -> list[int]:
    """The CRCs of n records laid end to end in `raw`, the first of them at position `first`."""
    return map_halves(lambda i: zlib.crc32(raw[i * size: (i + 1) * size - _CRC], first + i), range(n), n * size)


def _seal(records: np.ndarray, start: int) -> None:
    """Fill in the CRCs of records that will sit at positions start, start + 1, ..."""
    records["crc"] = _crcs(memoryview(records.view(np.uint8)), records.dtype.itemsize, start, len(records))


def _verified(records: np.ndarray) -> int:
    """How many of `records` (positions 0, 1, ...) verify, from the first on."""
    computed = _crcs(memoryview(records.view(np.uint8)), records.dtype.itemsize, 0, len(records))
    bad = np.flatnonzero(np.asarray(computed, dtype=np.uint32) != records["crc"])
    return int(bad[0]) if len(bad) else len(records)


def _sync(f) -> None:
    f.flush()
    os.fsync(f.fileno())
