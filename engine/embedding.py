"""A text's embedding through the model itself: the mean of its final hidden states (after the output norm,
before the output matrix), L2-normalised. The server's /v1/embeddings and the document fleet's chunk
index (engine.cartridge.fleet) both use it."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from engine.kv.cache import KvDtype
from engine.models.model import Model


def embed(model: Model, ids: Sequence[int], kv_dtype: KvDtype | str = KvDtype.F16) -> np.ndarray:
    """float32 [n_embd] of a non-empty id sequence that fits the model's context (a fresh cache each call)."""
    hidden = model.hidden_states(list(ids), model.new_cache(len(ids), KvDtype(kv_dtype)))
    mean = hidden.mean(axis=0, dtype=np.float64)
    return (mean / max(float(np.linalg.norm(mean)), 1e-12)).astype(np.float32)
