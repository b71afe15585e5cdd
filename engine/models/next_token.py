"""A next-token-prediction layer (MTP, "nextn": GLM-4.5's, DeepSeek-V3's): the model's own small draft model.

Trained beside the model, it predicts the token after next. Its row at position p takes the embedding of token
p + 1 and the model's final hidden state at p (after the output norm, what the output matrix reads), each
through its own norm (`enorm`, `hnorm`), joins them [embedding, hidden] and projects them back to the model's
width (`eh_proj`), runs them through one decoder layer of the model's kind (the layer's tensors under its own
`blk.N.` prefix, its KV rows in a cache of its own), and reads the next-token logits through its own norm
(`shared_head_norm`, else the model's output norm: Qwen3.5's may leave it out) and head (`shared_head_head`,
else the model's output matrix). Its embedding is
`embed_tokens`, else the model's. At position 0 the embedding is zeroed (as the reference implementations
do: the layer never saw a first token in training).

The file appends these layers to the model's (`nextn_predict_layers` of `block_count`); the model's forward
never runs them. Only drafts come from here (engine.speculative.next_token), so the numbers need not match
any other engine's bit for bit: its rows run row-wise, each the same bits however the rows are grouped.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Sequence

import numpy as np

from engine.gguf.reader import GGUFFile
from engine.gguf.weights import LinearWeight, load_vector
from engine.kv.cache import KvCache, KvDtype
from engine.models.block import Block, LayerArgs
from engine.models.layout import TensorSpec, layer_prefix, matrix, norm
from kernels.backend import Backend, Segment


def next_token_tensors(layer: LayerArgs, index: int, n_embd: int, vocab_size: int) -> list[TensorSpec]:
    """The tensors of the next-token-prediction layer at file index `index`: the decoder layer's and its own,
    `required` for the layer to be used (the model's table lists none as required: a file may hold the trunk
    alone; load_predictor checks a layer whole)."""
    p = layer_prefix(index)
    own = [matrix(p + "nextn.eh_proj.weight", n_embd, 2 * n_embd), norm(p + "nextn.enorm.weight", n_embd),
           norm(p + "nextn.hnorm.weight", n_embd), replace(norm(p + "nextn.shared_head_norm.weight", n_embd),
                                                           required=False),
           matrix(p + "nextn.embed_tokens.weight", vocab_size, n_embd, required=False),
           matrix(p + "nextn.shared_head_head.weight", vocab_size, n_embd, required=False)]
    return layer.tensors(p, n_embd) + own


class NextTokenPredictor:
    def __init__(self, file: GGUFFile, layer: LayerArgs, index: int, n_embd: int, eps: float,
                 embed: LinearWeight, output: LinearWeight, output_norm, backend: Backend):
        p = layer_prefix(index) + "nextn."
        vocab = embed.out_dim
        be = self.backend = backend
        self.layer_args, self.n_embd, self.eps = layer, n_embd, eps

        def vector(name: str):
            return be.upload_vector(load_vector(file, p + name, n_embd))

        def head_matrix(name: str, fallback: LinearWeight) -> LinearWeight:
            return LinearWeight.load(file, p + name, vocab, n_embd, be) if p + name in file.tensors else fallback

        self.embed = head_matrix("embed_tokens.weight", embed)
        self.enorm, self.hnorm = vector("enorm.weight"), vector("hnorm.weight")
        self.eh_proj = LinearWeight.load(file, p + "eh_proj.weight", n_embd, 2 * n_embd, be)
        self.block = Block(file, layer, index, n_embd, eps, be, cache_layer=0)
        self.head_norm = vector("shared_head_norm.weight") if p + "shared_head_norm.weight" in file.tensors \
            else output_norm
        self.head = head_matrix("shared_head_head.weight", output)

    @property
    def vocab_size(self) -> int:
        return self.head.out_dim

    def new_cache(self, capacity: int, dtype: KvDtype | str = KvDtype.F16) -> KvCache:
        """The layer's own KV rows, one per predicted position."""
        heads, dims = self.layer_args.mixer.kv_geometry()
        return KvCache([heads], [dims], capacity, dtype, self.backend, [self.layer_args.mixer.VALUE_IS_KEY])

    def forward(self, next_tokens: Sequence[int], hidden: np.ndarray, cache: KvCache, *,
                first_is_position_0: bool = False) -> np.ndarray:
        """Feed rows at cache.len: row i joins token next_tokens[i] (the one after the position it predicts
        from) with the model's hidden state there, hidden[i] [n_embd]; return the rows' output states
        [m, n_embd] (before the head's norm: what `logits` reads, and what a further row chained on a draft
        takes as its hidden state)."""
        be, m = self.backend, len(next_tokens)
        if cache.len + m > cache.capacity:
            raise ValueError(f"the next-token layer's cache holds {cache.capacity} rows; {cache.len} + {m} do not fit")
        e = be.to_host(self.embed.rows(np.asarray(next_tokens, dtype=np.int64)))
        if first_is_position_0:
            e[0] = 0.0
        joined = np.concatenate([be.to_host(be.rmsnorm(e, self.enorm, self.eps)),
                                 be.to_host(be.rmsnorm(np.ascontiguousarray(hidden, dtype=np.float32), self.hnorm,
                                                       self.eps))], axis=1)
        x = self.eh_proj(joined, row_wise=True)
        positions = np.arange(cache.len, cache.len + m)
        x = self.block(x, [Segment(0, m, cache.store, cache.len)], positions, row_wise=True)
        cache.advance(m)
        return be.to_host(x)

    def logits(self, states: np.ndarray) -> np.ndarray:
        """The next-token logits [m, vocab] of output states [m, n_embd]."""
        be = self.backend
        return be.to_host(self.head(be.rmsnorm(np.ascontiguousarray(states, dtype=np.float32), self.head_norm,
                                               self.eps), row_wise=True))


def missing_tensors(file: GGUFFile, layer: LayerArgs, index: int, n_embd: int, vocab_size: int) -> list[str] | None:
    """The tensors the next-token-prediction layer at `index` needs that the file lacks; None where it has none of
    them (a trunk-only file)."""
    wanted = [t.name for t in next_token_tensors(layer, index, n_embd, vocab_size) if t.required]
    missing = [name for name in wanted if name not in file.tensors]
    return None if len(missing) == len(wanted) else missing


def load_predictor(file: GGUFFile, layers: Sequence[LayerArgs], first_index: int, n_embd: int, eps: float,
                   embed: LinearWeight, output: LinearWeight, output_norm,
                   backend: Backend) -> NextTokenPredictor | None:
    """The first next-token-prediction layer of `layers` (file indexes from `first_index`), or None where there
    is none or the file holds none of its tensors; a layer the file holds only part of is left out with a
    warning naming what it lacks (the model itself runs as before)."""
    if not layers:
        return None
    missing = missing_tensors(file, layers[0], first_index, n_embd, embed.out_dim)
    if missing is None:
        return None
    if missing:
        warnings.warn(f"{file.path}: the next-token-prediction layer blk.{first_index} lacks "
                      f"{', '.join(missing[:4])}{' and more' if len(missing) > 4 else ''}; it is not used for drafts",
                      RuntimeWarning, stacklevel=3)
        return None
    return NextTokenPredictor(file, layers[0], first_index, n_embd, eps, embed, output, output_norm, backend)
