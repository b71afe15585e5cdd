"""A validating, memory-mapped GGUF reader.

The `gguf` package's own reader builds a NumPy view per metadata item, which takes
~18 s on Qwen2.5's 151k-token vocabulary; this one walks the header once with
`struct`, checks every length against the file size before trusting it (so a
corrupt file fails fast instead of allocating gigabytes), and exposes tensor
payloads as zero-copy views of one `mmap`.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.errors import GGUFError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4

# GGUF metadata value types: id -> (struct code, size); 8 = string, 9 = array.
_SCALAR_TYPES = {
    0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4),
    6: ("f", 4), 7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8),
}
_NUMPY_OF_SCALAR = {
    0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
    6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64,
}
_STRING, _ARRAY = 8, 9

# Header limits well above any real model's (under a hundred metadata keys, a few thousand tensors, a
# tokenizer's tokens, types, scores and merges together under a million items: Gemma 3's 262k-token
# vocabulary takes 786k), so a hostile header is refused before it costs seconds or gigabytes: each array
# item becomes a Python object (2M strings: a few seconds and under 200 MB).
MAX_METADATA_KEYS = 1 << 16
MAX_TENSORS = 1 << 16
MAX_ARRAY_DEPTH = 4  # arrays of arrays, nested this deep at most (llama.cpp reads none)
MAX_ARRAY_ITEMS = 1 << 21  # all metadata array items of the file together
MAX_NESTED_ARRAYS = 1 << 16  # arrays inside arrays, all together


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file. `shape` is (rows..., cols): the reverse of GGUF's ne order."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.ggml_type)


def ggml_type_name(ggml_type: int) -> str:
    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"unknown type {ggml_type}"


def _tensor_nbytes(name: str, ggml_type: int, shape: tuple[int, ...]) -> int:
    try:
        block_elems, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise GGUFError(f"tensor {name!r} has an unknown GGML type id {ggml_type}") from None
    cols = shape[-1]
    if cols % block_elems:
        raise GGUFError(
            f"tensor {name!r}: row length {cols} is not a multiple of the "
            f"{ggml_type_name(ggml_type)} block size {block_elems}"
        )
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return rows * (cols // block_elems) * block_bytes


class _Cursor:
    """Reads little-endian values from a buffer, refusing to run past its end."""

    def __init__(self, buf, path: str):
        self.buf = buf
        self.pos = 0
        self.size = len(buf)
        self.path = path
        self.items_left = MAX_ARRAY_ITEMS
        self.nested_left = MAX_NESTED_ARRAYS

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(
                f"{self.path}: truncated or corrupt file: {what} needs {n} bytes at offset "
                f"{self.pos}, but the file is {self.size} bytes"
            )

    def scalar(self, code: str, size: int, what: str):
        self.need(size, what)
        (v,) = struct.unpack_from("<" + code, self.buf, self.pos)
        self.pos += size
        return v

    def u32(self, what: str) -> int:
        return self.scalar("I", 4, what)

    def u64(self, what: str) -> int:
        return self.scalar("Q", 8, what)

    def string(self, what: str) -> str:
        n = self.u64(what + " length")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        # surrogateescape keeps byte-level tokens that are not valid UTF-8 lossless
        return raw.decode("utf-8", "surrogateescape")

    def value(self, vtype: int, what: str):
        if vtype in _SCALAR_TYPES:
            code, size = _SCALAR_TYPES[vtype]
            return self.scalar(code, size, what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            return self.array(what, depth=1)
        raise GGUFError(f"{self.path}: {what} has an unknown value type {vtype}")

    def array(self, what: str, depth: int):
        item_type = self.u32(what + " item type")
        count = self.u64(what + " count")
        if item_type in _SCALAR_TYPES:
            size = _SCALAR_TYPES[item_type][1]
            self.need(count * size, what)
            self._spend_items(count, what)
            arr = np.frombuffer(self.buf, dtype=_NUMPY_OF_SCALAR[item_type], count=count, offset=self.pos)
            self.pos += count * size
            return arr.copy()  # small; a copy keeps metadata alive after close()
        if item_type == _STRING:
            self.need(count * 8, what)  # every string has at least its length field
            self._spend_items(count, what)
            return self._string_array(count, what)
        if item_type == _ARRAY:
            self.need(count * 12, what)  # every array has at least its item type and count
            self._spend_items(count, what)
            if depth >= MAX_ARRAY_DEPTH:
                raise GGUFError(f"{self.path}: {what} nests arrays more than {MAX_ARRAY_DEPTH} deep")
            if count > self.nested_left:
                raise GGUFError(f"{self.path}: {what} holds more nested arrays than the file may "
                                f"({MAX_NESTED_ARRAYS} in all)")
            self.nested_left -= count
            return [self.array(what, depth + 1) for _ in range(count)]
        raise GGUFError(f"{self.path}: {what} has an unknown array item type {item_type}")

    def _spend_items(self, count: int, what: str) -> None:
        if count > self.items_left:
            raise GGUFError(f"{self.path}: {what} has {count} array items; a GGUF's metadata arrays may hold "
                            f"{MAX_ARRAY_ITEMS} in all")
        self.items_left -= count

    def _string_array(self, count: int, what: str) -> list[str]:
        buf, pos, size = self.buf, self.pos, self.size
        unpack = struct.Struct("<Q").unpack_from
        out = [None] * count
        for i in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8, what)
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > size:
                self.pos = pos
                self.need(n, f"{what}[{i}]")
            out[i] = bytes(buf[pos : pos + n]).decode("utf-8", "surrogateescape")
            pos += n
        self.pos = pos
        return out


class GGUFFile:
    """An open GGUF file: `metadata` (key -> Python value) and `tensors` (name -> TensorInfo)."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise GGUFError(f"{self.path}: no such file") from None
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot open: {e.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            if size < 24:
                raise GGUFError(f"{self.path}: not a GGUF file (only {size} bytes)")
            self._mmap = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        try:
            self._parse()
        except Exception:
            self.close()
            raise

    def _parse(self) -> None:
        cur = _Cursor(self._mmap, self.path)
        magic = bytes(self._mmap[:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        cur.pos = 4
        self.version = cur.u32("version")
        if self.version not in (2, 3):
            raise GGUFError(f"{self.path}: unsupported GGUF version {self.version} (supported: 2, 3)")
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata count")
        # Each metadata item and tensor info takes at least 12 / 24 bytes: an absurd
        # count fails here rather than after looping over garbage.
        cur.need(n_kv * 12 + n_tensors * 24, f"{n_kv} metadata items and {n_tensors} tensor infos")
        if n_kv > MAX_METADATA_KEYS or n_tensors > MAX_TENSORS:
            raise GGUFError(f"{self.path}: {n_kv} metadata items and {n_tensors} tensors; a model has at most "
                            f"{MAX_METADATA_KEYS} and {MAX_TENSORS}")

        self.metadata: dict[str, object] = {}
        for _ in range(n_kv):
            key = cur.string("metadata key")
            vtype = cur.u32(f"type of {key!r}")
            self.metadata[key] = cur.value(vtype, f"metadata {key!r}")

        infos = []
        for _ in range(n_tensors):
            name = cur.string("tensor name")
            n_dims = cur.u32(f"rank of tensor {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise GGUFError(f"{self.path}: tensor {name!r} has rank {n_dims} (expected 1..{MAX_DIMS})")
            ne = [cur.u64(f"dims of tensor {name!r}") for _ in range(n_dims)]
            ggml_type = cur.u32(f"type of tensor {name!r}")
            offset = cur.u64(f"offset of tensor {name!r}")
            infos.append((name, ne, ggml_type, offset))

        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(f"{self.path}: general.alignment {alignment!r} is not a power of two")
        data_start = (cur.pos + alignment - 1) // alignment * alignment

        self.tensors: dict[str, TensorInfo] = {}
        for name, ne, ggml_type, offset in infos:
            shape = tuple(int(d) for d in reversed(ne))
            if any(d == 0 for d in shape) or any(d > 1 << 40 for d in shape):
                raise GGUFError(f"{self.path}: tensor {name!r} has an invalid shape {shape}")
            nbytes = _tensor_nbytes(name, ggml_type, shape)
            start = data_start + offset
            if start + nbytes > len(self._mmap):
                raise GGUFError(
                    f"{self.path}: tensor {name!r} runs past the end of the file "
                    f"(needs bytes {start}..{start + nbytes}, file is {len(self._mmap)} bytes) — "
                    "the file is truncated or corrupt"
                )
            if name in self.tensors:
                raise GGUFError(f"{self.path}: duplicate tensor name {name!r}")
            self.tensors[name] = TensorInfo(name, ggml_type, shape, start, nbytes)

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: missing general.architecture")
        return arch

    def raw(self, info: TensorInfo) -> np.ndarray:
        """The tensor's bytes as a zero-copy uint8 view shaped [rows, row_bytes]."""
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        return np.frombuffer(self._mmap, dtype=np.uint8, count=info.nbytes, offset=info.offset).reshape(rows, -1)

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: missing tensor {name!r}") from None

    def file_size(self) -> int:
        return len(self._mmap)

    def close(self) -> None:
        m = getattr(self, "_mmap", None)
        if m is not None:
            try:
                m.close()
            except BufferError:
                pass  # live NumPy views still use it; the mapping goes when they do
            self._mmap = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_gguf(path: str | os.PathLike | Path) -> GGUFFile:
    return GGUFFile(path)
