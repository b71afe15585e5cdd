"""What a model file must satisfy before its kernels run, and the checks at the engine's edges.

The Numba kernels index without bounds checks, so every value they rely on is checked here, once, when
the model is built (engine.models.build_model), and the inputs that reach them are checked per call:

- layers: `block_count` is the number of `blk.N.` layers in the file, before any per-layer list is
  sized from it; per-layer values (kv heads, RoPE bases, windows) have one entry per layer. Each kind of
  layer part checks its own args (its `check_layers`); attention's are these:
- RoPE rotates pairs inside dims [0, rope_dims) of each head: 0 < rope_dims <= head_dim, even.
- grouped-query attention reads kv head h // (n_head / n_head_kv): n_head_kv divides n_head.
- weights, caches: every tensor the family's table lists must have exactly the shape it gives
  (check_tensors; LinearWeight.load and load_vector check again as they load), and KV caches are made from, and checked against, the
  same geometry (Transformer.new_cache, _check_cache), so no kernel reads past a row.
- the embedding lookup gathers row `id`: the embedding and output matrices have vocab_size rows (their
  load checks the shape), the tokenizer has exactly vocab_size tokens (so every id it makes, and every
  id sampled from the logits, is a row and a token), and ids from callers are checked
  (check_token_ids; the forward refuses them too).
- sliding windows are >= 0 (0 = global); eps, RoPE bases and scales are finite and positive.

Weights holding NaN or Inf are refused at load (check_weights); a model whose activations overflow can
still produce NaN or Inf logits, and check_logits turns those into an error instead of a garbage reply.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

import numpy as np

from engine.errors import ConfigError, GGUFError, InvalidTokenId, NonFiniteLogits, WeightShapeError
from engine.gguf import scan_records
from engine.gguf.finite import first_non_finite
from engine.gguf.meta import ZeroPolicy, meta_int, meta_int_opt, meta_value
from engine.gguf.reader import GGUFFile
from engine.models.args import ModelArgs
from engine.models.layout import EXPERTS, MATRIX
from engine.models.parts import first_problem, positive

_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.")


def check_layer_count(file: GGUFFile, arch: str) -> None:
    """`<arch>.block_count` equals the layers the file has tensors for; the next-token-prediction layers it
    counts last (`<arch>.nextn_predict_layers`: GLM-4.5's MTP) may be left out of the file, as llama.cpp's
    trunk-only load allows."""
    n = meta_int(file.metadata, arch, "block_count")
    nextn = meta_int_opt(file.metadata, arch, "nextn_predict_layers", ZeroPolicy.ACCEPT_ZERO) or 0
    layers = {int(m.group(1)) for m in map(_LAYER_TENSOR.match, file.tensors) if m}
    present = max(layers) + 1 if layers else 0
    if present not in (n, n - nextn) or len(layers) != present:
        span = f" (blk.0 .. blk.{present - 1})" if layers else ""
        raise ConfigError(f"{file.path}: {arch}.block_count is {n}, but the file has tensors for "
                          f"{len(layers)} layers{span}")


def check_args(file: GGUFFile, args: ModelArgs) -> None:
    """Every kernel precondition that follows from the metadata alone; the first broken one is a
    ConfigError naming its key. Each kind of layer part checks its own (engine.models.parts)."""
    a, arch = args, args.arch
    problem = first_problem([
        (a.n_layers >= 1 and a.n_embd >= 1, f"{arch}.block_count and embedding_length must be positive"),
        (a.vocab_size >= 1, f"{arch}.vocab_size is {a.vocab_size}; it must be positive"),
        (positive(a.norm_eps), f"{arch}.attention.layer_norm_rms_epsilon is {a.norm_eps}; it must be positive"),
        (positive(a.embed_scale), f"embedding scale {a.embed_scale} must be positive"),
    ])
    for part in ("mixer", "feed_forward"):
        kinds: dict[type, list] = {}
        for layer in a.layers:
            kinds.setdefault(type(getattr(layer, part)), []).append(getattr(layer, part))
        for kind, layers in kinds.items():
            problem = problem or kind.check_layers(arch, layers)
    if problem:
        raise ConfigError(f"{file.path}: {problem}")
    tokens = meta_value(file.metadata, "tokenizer.ggml.tokens", "strings")
    if tokens is not None and len(tokens) != a.vocab_size:
        raise ConfigError(f"{file.path}: the model has {a.vocab_size} token rows ({arch}.vocab_size) but "
                          f"tokenizer.ggml.tokens has {len(tokens)} tokens")


def check_tensors(file: GGUFFile, args: ModelArgs) -> None:
    """The file has every tensor the family's table (engine.models.layout) requires, each of the shape it
    gives: one error naming every missing tensor, or the first of the wrong shape."""
    specs = args.tensors()
    missing = [s.name for s in specs if s.required and s.name not in file.tensors]
    if missing:
        names = ", ".join(repr(n) for n in missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise GGUFError(f"{file.path}: missing tensor{'s' if len(missing) > 1 else ''} {names}")
    for spec in specs:
        info = file.tensors.get(spec.name)
        if info is not None and info.shape != spec.shape:
            axes = {MATRIX: " (out, in)", EXPERTS: " (expert, out, in)"}.get(spec.role, "")
            expected = f"{list(spec.shape)}{axes}"
            raise WeightShapeError(f"{file.path}: tensor {spec.name!r} has shape {list(info.shape)}, "
                                   f"expected {expected}")


def check_weights(file: GGUFFile) -> None:
    """No tensor stores a NaN or Inf (engine.gguf.finite: the quantized kernels would hide it); a file that
    passed before, unchanged since, is not read again (engine.gguf.scan_records)."""
    path = Path(file.path)
    st = path.stat()
    if scan_records.passed_before(path, st, "finite"):
        return
    bad = first_non_finite(file)
    if bad is not None:
        raise GGUFError(f"{file.path}: tensor {bad!r} holds NaN or Inf values; the file is corrupt")
    scan_records.record_pass(path, st, "finite")


def check_token_ids(ids: Sequence[int], vocab_size: int) -> None:
    """Token ids given by a caller (not made by the tokenizer) are rows of the vocabulary."""
    for pos, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise InvalidTokenId(f"token id {t} at position {pos} is outside the vocabulary (0..{vocab_size - 1})")


def check_logits(logits: np.ndarray, position: int) -> None:
    """Logits rows ([vocab] or [rows, vocab], the first at cache position `position`) are all finite."""
    finite = np.isfinite(logits).all(axis=-1)
    if not np.all(finite):
        bad = position + (int(np.argmin(finite)) if finite.ndim else 0)
        raise NonFiniteLogits(f"the model produced non-finite logits at position {bad} (NaN or Inf: its "
                              "activations overflow; the model file is broken)")
