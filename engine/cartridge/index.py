"""The chunk index of a document fleet: which chunks a question is about, by cosine similarity of
embeddings computed through the model itself (engine.embedding).

Raw causal-LM embeddings are anisotropic: they share one large common direction, and cosine over them
ranks chunks by little more than their length. The index therefore centres the chunks' embeddings on
their mean (the centroid, kept with the index) and L2-normalises them again; a question's embedding is
centred on the same centroid before the cosines.

Stored as one safetensors file next to the cartridges (`vectors` [chunks, n_embd] and `centroid`
[n_embd] float32), its metadata naming the model fingerprint, the cache type the embeddings ran with,
the document's hash, the chunk budget and each chunk's hash, and a CRC-32 of the tensors. Loading refuses
(CartridgeRefused) a file that is damaged or was built for another model, document or split; the fleet
then embeds the chunks again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.cartridge.store import tensors_crc, write_file
from engine.errors import CartridgeRefused

FORMAT = "fucina-fleet-index-1"


@dataclass
class ChunkIndex:
    vectors: np.ndarray  # float32 [chunks, n_embd]: centred on `centroid`, L2-normalised
    centroid: np.ndarray  # float32 [n_embd]
    fingerprint: bytes  # the model's (engine.kv.persist.model_fingerprint)
    kv_dtype: str
    document: str  # SHA-256 (hex) of the whole document's text
    chunk_budget: int  # the token budget it was split with
    chunks: list[str]  # SHA-256 (hex) of each chunk's text, in document order

    @classmethod
    def from_embeddings(cls, embeddings: np.ndarray, **identity) -> "ChunkIndex":
        """From the chunks' raw embeddings [chunks, n_embd] (engine.embedding.embed, one row per chunk)."""
        raw = np.asarray(embeddings, dtype=np.float32)
        centroid = raw.mean(axis=0, dtype=np.float64).astype(np.float32)
        return cls(_normalised(raw - centroid), centroid, **identity)

    def scores(self, embedding: np.ndarray) -> np.ndarray:
        """Each chunk's cosine with a question's raw embedding, centred the way the chunks were."""
        return self.vectors @ _normalised(np.asarray(embedding, dtype=np.float32) - self.centroid)

    def ranking(self, embedding: np.ndarray) -> list[int]:
        """The chunks' indices, most similar first (ties: the earlier chunk first)."""
        return [int(i) for i in np.argsort(-self.scores(embedding), kind="stable")]


def _normalised(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(norm, 1e-12)).astype(np.float32)


def save(index: ChunkIndex, path: str | os.PathLike) -> Path:
    """Write the index (a temporary file renamed over the old one); a StoreError leaves no file behind."""
    import safetensors.numpy

    path = Path(path)
    tensors = {"vectors": np.ascontiguousarray(index.vectors), "centroid": np.ascontiguousarray(index.centroid)}
    metadata = {"format": FORMAT, "fingerprint": index.fingerprint.hex(), "kv_dtype": index.kv_dtype,
                "document": index.document, "chunk_budget": str(index.chunk_budget),
                "chunks": json.dumps(index.chunks), "crc32": str(tensors_crc(tensors))}
    return write_file(path, safetensors.numpy.save(tensors, metadata))


def load(path: str | os.PathLike, expect: dict) -> ChunkIndex:
    """The index in `path` when it was built for `expect` (fingerprint, kv_dtype, document, chunk_budget,
    chunks: ChunkIndex's identity fields), else CartridgeRefused saying what differs."""
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(path, framework="numpy") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except FileNotFoundError:
        raise CartridgeRefused(f"no chunk index at {path}") from None
    except Exception as e:  # safetensors raises its own error type for every kind of damage
        raise CartridgeRefused(f"the chunk index {path} is damaged: {e}") from None
    if meta.get("format") != FORMAT:
        raise CartridgeRefused(f"{path} is not a Fucina chunk index (or one of another format)")
    found = {"fingerprint": meta.get("fingerprint"), "kv_dtype": meta.get("kv_dtype"),
             "document": meta.get("document"), "chunk_budget": meta.get("chunk_budget"), "chunks": meta.get("chunks")}
    want = dict(expect, fingerprint=expect["fingerprint"].hex(), chunk_budget=str(expect["chunk_budget"]),
                chunks=json.dumps(expect["chunks"]))
    for field in ("fingerprint", "kv_dtype", "document", "chunk_budget", "chunks"):
        if found[field] != want[field]:
            what = "another model" if field == "fingerprint" else f"another {field.replace('_', ' ')}"
            raise CartridgeRefused(f"the chunk index {path} was built for {what}")
    vectors, centroid = tensors.get("vectors"), tensors.get("centroid")
    if (set(tensors) != {"vectors", "centroid"} or vectors.dtype != np.float32 or centroid.dtype != np.float32
            or vectors.shape[:1] != (len(expect["chunks"]),) or vectors.shape[1:] != centroid.shape):
        raise CartridgeRefused(f"the chunk index {path} does not hold one vector per chunk")
    if meta.get("crc32") != str(tensors_crc(tensors)):
        raise CartridgeRefused(f"the chunk index {path} is damaged (its vectors fail their checksum)")
    return ChunkIndex(vectors, centroid, **expect)

