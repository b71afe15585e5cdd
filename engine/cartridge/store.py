"""Cartridges on disk: one safetensors file each, under the data dir's `cartridges/` folder.

A file is named by its cartridge's id (document hash, model fingerprint, cache type) and holds the spec's
state dict: `layers.<i>.k` and `layers.<i>.v` ([rows, kv_heads, head_dim] f16, or [rows, kv_heads, row
bytes] u8 of q8_0 blocks: the cache's storage form, so a load is bitwise the rows that were saved; no
`layers.<i>.v` where the layer's V rows are its K rows, as latent attention's), `draft_reference` (i64 token
ids) and, for a hybrid model, its recurrent state after the document: `state.<i>.conv` and `state.<i>.ssm`
(f32) per recurrent layer. Its metadata records the format, the model fingerprint, the geometry,
the document's hash and name, and a CRC-32 of the tensor bytes.

Loading refuses (CartridgeRefused) a file that does not parse, fails its CRC, or was built for another
model, cache type or geometry; the caller builds the cartridge again and the save replaces the file.
Saves write a temporary file and rename it over the old one, so a crash never leaves half a cartridge
under a cartridge's name. The folder is kept within a disk budget by deleting the least recently used
cartridges (a file's modification time is its last use: attach touches it); a deleted one is simply read
again when its document is attached next.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.cartridge.cartridge import Cartridge
from engine.errors import CartridgeRefused
from engine.kv.cache import KvCache, KvDtype
from engine.platform.paths import data_dir
from engine.platform.storage_errors import storage_error

FORMAT = "fucina-cartridge-1"
SUFFIX = ".safetensors"


def cartridge_dir() -> Path:
    return data_dir() / "cartridges"


def path_for(cartridge_id: str, directory: str | os.PathLike | None = None) -> Path:
    return Path(directory or cartridge_dir()) / f"{cartridge_id}{SUFFIX}"


def save(cart: Cartridge, directory: str | os.PathLike | None = None) -> Path:
    """Store the cartridge under its id; a StoreError (a full or read-only disk) leaves no file behind."""
    import safetensors.numpy

    path = path_for(cart.id, directory)
    tensors = {}
    for i, (k, v) in enumerate(zip(cart.k, cart.v)):
        tensors[f"layers.{i}.k"] = _tensor(cart.dtype, k)
        if v is not k:  # a layer whose V rows are its K rows (Cartridge.from_cache) keeps them once
            tensors[f"layers.{i}.v"] = _tensor(cart.dtype, v)
    tensors["draft_reference"] = cart.draft_reference.astype(np.int64)
    if cart.state is not None:
        for i, (conv, ssm) in enumerate(zip(*cart.state)):
            tensors[f"state.{i}.conv"], tensors[f"state.{i}.ssm"] = conv, ssm
    metadata = {"format": FORMAT, "fingerprint": cart.fingerprint.hex(), "kv_dtype": cart.dtype.value,
                "kv_heads": json.dumps([k.shape[1] for k in cart.k]), "head_dims": json.dumps(list(cart.head_dims)),
                "rows": str(cart.rows), "document": cart.document, "name": cart.name, "model": cart.model,
                "crc32": str(tensors_crc(tensors))}
    return write_file(path, safetensors.numpy.save(tensors, metadata))


def write_file(path: Path, data: bytes) -> Path:
    """Write `data` to a temporary file and rename it over `path`: a crash never leaves half a file under
    the name, and a StoreError (a full or read-only disk) leaves no file behind."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise storage_error(e, path) from e
    return path


def load(path: str | os.PathLike, like: KvCache, fingerprint: bytes) -> Cartridge:
    """The cartridge in `path`, checked against the model (`fingerprint`) and the cache it will be written
    into (`like`: its dtype and per-layer geometry)."""
    import safetensors.numpy

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CartridgeRefused(f"cannot read the cartridge {path}: {e.strerror or e}") from None
    meta = _metadata(path, data)
    if meta.get("fingerprint") != fingerprint.hex():
        raise CartridgeRefused(f"the cartridge {path} was built for another model")
    if meta.get("kv_dtype") != like.dtype.value:
        raise CartridgeRefused(f"the cartridge {path} holds a {meta.get('kv_dtype')} KV cache, not {like.dtype.value}")
    try:
        tensors = safetensors.numpy.load(data)
    except Exception as e:  # safetensors raises its own error type for every kind of damage
        raise CartridgeRefused(f"the cartridge {path} is damaged: {e}") from None
    n, shared, shapes = like.n_layers, like.value_is_key, like.state_shapes
    want = ({f"layers.{i}.k" for i in range(n)} | {f"layers.{i}.v" for i in range(n) if not shared[i]}
            | {"draft_reference"} | {f"state.{i}.{part}" for i in range(len(shapes)) for part in ("conv", "ssm")})
    if set(tensors) != want:
        raise CartridgeRefused(f"the cartridge {path} does not hold the {n} layers of this model's KV cache"
                               f"{' and its recurrent state' if shapes else ''}")
    tokens = tensors["draft_reference"]
    k = [_rows(like, path, tensors[f"layers.{i}.k"], i, len(tokens)) for i in range(n)]
    v = [k[i] if shared[i] else _rows(like, path, tensors[f"layers.{i}.v"], i, len(tokens)) for i in range(n)]
    if tokens.dtype != np.int64 or tokens.ndim != 1 or not len(tokens) or meta.get("rows") != str(len(tokens)):
        raise CartridgeRefused(f"the cartridge {path} has no valid draft_reference")
    if meta.get("crc32") != str(tensors_crc(tensors)):
        raise CartridgeRefused(f"the cartridge {path} is damaged (its rows fail their checksum)")
    return Cartridge(k, v, like.dtype, tokens, fingerprint, meta.get("document", ""), like.head_dims,
                     meta.get("name", ""), meta.get("model", ""), _state(path, tensors, shapes), tuple(shapes))


def _state(path: Path, tensors: dict, shapes) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    """The recurrent state in the file, when its layers are of this model's shapes (None: the model has none)."""
    if not shapes:
        return None
    conv = [tensors[f"state.{i}.conv"] for i in range(len(shapes))]
    ssm = [tensors[f"state.{i}.ssm"] for i in range(len(shapes))]
    for i, (c, s, (conv_shape, ssm_shape)) in enumerate(zip(conv, ssm, shapes)):
        if (c.dtype, s.dtype) != (np.float32, np.float32) or (c.shape, s.shape) != (conv_shape, ssm_shape):
            raise CartridgeRefused(f"the cartridge {path} has a recurrent state of other shapes than this model's "
                                   f"(layer {i})")
    return conv, ssm


@dataclass(frozen=True)
class StoredCartridge:
    """What a cartridge file says about itself (for a list), without its rows."""
    id: str
    path: Path
    name: str
    rows: int
    kv_dtype: str
    fingerprint: str
    bytes: int
    used_at: float  # last built or attached (the file's modification time)
    model: str = ""  # the model file's name ("" in files saved before it was recorded)


def stored(directory: str | os.PathLike | None = None) -> list[StoredCartridge]:
    """The cartridges in the folder, most recently used first; files that do not parse are left out."""
    out = []
    for path in Path(directory or cartridge_dir()).glob(f"*{SUFFIX}"):
        try:
            with open(path, "rb") as f:
                meta = _metadata(path, f.read(_header_len(f) + 8))
            st = path.stat()
        except (OSError, CartridgeRefused):
            continue
        out.append(StoredCartridge(path.name[: -len(SUFFIX)], path, meta.get("name", ""), int(meta.get("rows", 0)),
                                   meta.get("kv_dtype", ""), meta.get("fingerprint", ""), st.st_size, st.st_mtime,
                                   meta.get("model", "")))
    return sorted(out, key=lambda c: -c.used_at)


def delete(cartridge: StoredCartridge) -> None:
    """Remove a stored cartridge (its document is read again when it is attached next)."""
    try:
        cartridge.path.unlink(missing_ok=True)
    except OSError as e:
        raise storage_error(e, cartridge.path) from e


def evict(budget_bytes: int, directory: str | os.PathLike | None = None, *, keep: Path | None = None) -> list[Path]:
    """Delete the least recently used cartridges until the folder holds at most `budget_bytes` (never
    `keep`, the one just attached); the deleted files."""
    held = stored(directory)
    total = sum(c.bytes for c in held)
    removed = []
    for c in reversed(held):  # least recently used first
        if total <= budget_bytes:
            break
        if keep is not None and c.path == Path(keep):
            continue
        try:
            c.path.unlink()
        except FileNotFoundError:  # another process evicted it
            pass
        total -= c.bytes
        removed.append(c.path)
    return removed


def _tensor(dtype: KvDtype, rows: np.ndarray) -> np.ndarray:
    return rows.view(np.float16) if dtype is KvDtype.F16 else rows


def _rows(like: KvCache, path: Path, tensor: np.ndarray, layer: int, n: int) -> np.ndarray:
    """A layer's tensor as cache rows, when its shape and type are this cache's."""
    dtype, shape = like.row_layout(layer)
    rows = tensor.view(np.uint16) if tensor.dtype == np.float16 else tensor
    if rows.dtype != dtype or rows.shape != (n, *shape):
        raise CartridgeRefused(f"the cartridge {path} has layer {layer} rows of shape {tensor.shape} "
                               f"({tensor.dtype}); this model's cache needs [{n}, {shape[0]}, ...] rows")
    return np.ascontiguousarray(rows)


def tensors_crc(tensors: dict) -> int:
    """CRC-32 of a state dict's tensor bytes, in name order (what a file's metadata records)."""
    crc = 0
    for name in sorted(tensors):
        crc = zlib.crc32(np.ascontiguousarray(tensors[name]).view(np.uint8).data, crc)
    return crc


def _header_len(f) -> int:
    raw = f.read(8)
    f.seek(0)
    return struct.unpack("<Q", raw)[0] if len(raw) == 8 else 0


def _metadata(path: Path, data: bytes) -> dict:
    """A safetensors file's `__metadata__`, when it is a cartridge of this format."""
    try:
        (n,) = struct.unpack("<Q", data[:8])
        if n > len(data) - 8:
            raise ValueError("the header runs past the end of the file")
        meta = json.loads(data[8: 8 + n]).get("__metadata__") or {}
    except (struct.error, ValueError, AttributeError) as e:
        raise CartridgeRefused(f"the cartridge {path} is damaged: {e}") from None
    if meta.get("format") != FORMAT:
        raise CartridgeRefused(f"{path} is not a Fucina cartridge (or one of another format)")
    return meta
