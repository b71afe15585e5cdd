"""What chat, speculation, the service and cartridges use of a model: the `Model` protocol.

engine.models.transformer.Transformer is the one implementation today (every family is a stack of
composed layers); code above the models names this protocol, so a model built another way fits.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from engine.gguf.reader import GGUFFile
from engine.kv.cache import KvCache, KvDtype
from engine.models.args import ModelArgs
from engine.models.next_token import NextTokenPredictor
from kernels.backend import Backend

# Prompts are fed in slices of at most this many tokens, so activations stay bounded
# (a 4k-token prompt would otherwise hold several [4096, n_ff] f32 buffers at once).
UBATCH = 512


class Model(Protocol):
    file: GGUFFile
    args: ModelArgs
    backend: Backend
    next_token: NextTokenPredictor | None  # the file's next-token-prediction layer (a draft source's model)

    @property
    def vocab_size(self) -> int: ...

    @property
    def n_layers(self) -> int: ...

    def new_cache(self, capacity: int, dtype: KvDtype | str = KvDtype.F16) -> KvCache:
        """Empty memory for `capacity` positions of one conversation."""

    def forward(self, tokens: Sequence[int], cache: KvCache) -> np.ndarray:
        """Feed tokens at position cache.len; the last row's logits [vocab] (one token: a row-wise decode
        step; more: a prefill)."""

    def feed(self, tokens: Sequence[int], cache: KvCache) -> None:
        """What forward does to the cache, without the logits: a prompt's slices whose logits nobody reads
        skip the output product (151,936 rows of the vocabulary on Qwen)."""

    def forward_all(self, tokens: Sequence[int], cache: KvCache) -> np.ndarray:
        """Feed tokens through the prefill path; every row's logits [n, vocab]."""

    def forward_rows(self, tokens: Sequence[int], cache: KvCache) -> np.ndarray:
        """Feed tokens row-wise; every row's logits [n, vocab], each bitwise what feeding them one at a time
        gives (the speculative verify forward)."""

    def rows_ready(self, cache: KvCache, wait: bool = False) -> bool:
        """Whether forward_rows of several rows runs at its own speed yet (asking starts its kernels'
        compilation; wait: and waits for it)."""

    def hidden_states(self, tokens: Sequence[int], cache: KvCache) -> np.ndarray:
        """Feed tokens through the prefill path; every row's final normed hidden state [n, n_embd]."""

    def decode_batch(self, tokens: Sequence[int], caches: Sequence[KvCache]) -> np.ndarray:
        """One row-wise decode step for several conversations: logits [len(caches), vocab]."""
