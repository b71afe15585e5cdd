"""Tiny random GGUF models for every family, written with gguf.GGUFWriter."""

from __future__ import annotations

import re

import numpy as np
import gguf
from gguf.constants import GGMLQuantizationType as T

from engine.models import tiny
from engine.models.layout import EXPERTS, MATRIX, NORM
from tests.quant_weights import random_weight

# gguf.quants cannot quantize these: their weights are random blocks (tests.quant_weights)
_RANDOM_BLOCK_TYPES = {T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL}


def _quantized(arr: np.ndarray, qtype: T, rng: np.random.Generator, block_scales: tuple[float, float]):
    """(data, raw_dtype) for add_tensor: F32 as is, K-quants random blocks of the same shape (f16 scales in
    ±block_scales), others pre-quantized by gguf.quants."""
    if qtype == T.F32:
        return arr.astype(np.float32), None
    if qtype in _RANDOM_BLOCK_TYPES:
        rows = int(np.prod(arr.shape[:-1]))
        return random_weight(qtype, rows, arr.shape[-1], rng, block_scales).reshape(*arr.shape[:-1], -1), qtype
    return gguf.quants.quantize(arr.astype(np.float32), qtype), qtype


def write_tiny_model(path, arch: str = "llama", *, n_layers: int = 2, n_embd: int = 64, n_head: int = 4,
                     n_head_kv: int = 2, head_dim: int | None = None, n_ff: int = 96, vocab: int = 128,
                     qtype: T = T.Q8_0, tied: bool = True, window: int = 8, seed: int = 0,
                     metadata: dict | None = None, skip_tensors: tuple = (), tokenizer: bool = False,
                     fill: dict | None = None, family_metadata: dict | None = None,
                     expert_qtype: T | None = None, block_scales: tuple[float, float] = (1e-3, 1e-1),
                     std: dict | None = None, tokenizer_pre: str = "gpt2", center: dict | None = None) -> None:
    """`qtype`: the matrices' format, `expert_qtype` the stacked experts' (default: qtype); `block_scales`: the range
    of random K-quant blocks' scales; `std`: the spread of the tensors named by their name after "blk.N." (the other
    matrices: 0.5 for the embedding, 0.08; the other vectors 0.05 around 1 or 0, or around `center`'s value for the names
it has, after "blk.N." too); `family_metadata`: keys beyond the
    standard ones that the family reads (values as Python ints, floats, strings or lists); `metadata` maps keys to
    (value, GGUFValueType), added last so they override the standard ones (hostile values: the tensors written are
    those of the standard ones); `tokenizer` adds CHATML_TOKENIZER (and sizes the vocabulary for it) with the
    pre-tokenizer `tokenizer_pre` (llama.cpp refuses "gpt2": a model it loads says "qwen2"); `fill` sets tensors to
    a constant after their values are drawn (a NaN norm, an overflow, a zero matrix of a type gguf.quants makes)."""
    rng = np.random.default_rng(seed)
    if tokenizer:
        vocab = len(CHATML_TOKENS)
    w = gguf.GGUFWriter(str(path), arch)
    meta = tiny.standard_metadata(arch, n_layers=n_layers, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                                  n_ff=n_ff, vocab=vocab, head_dim=head_dim, window=window)
    meta |= family_metadata or {}
    tiny.write_metadata(w, meta)
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(tokenizer_pre)
        w.add_token_list(CHATML_TOKENIZER["tokenizer.ggml.tokens"])
        w.add_token_types(CHATML_TOKENIZER["tokenizer.ggml.token_type"])
        w.add_token_merges(CHATML_TOKENIZER["tokenizer.ggml.merges"])
        w.add_eos_token_id(CHATML_TOKENIZER["tokenizer.ggml.eos_token_id"])
        w.add_add_bos_token(False)
    for k, v in (metadata or {}).items():
        w.add_key_value(k, v[0], v[1])

    for spec in tiny.tensors(arch, meta):  # the family's own table, in its order (the draws follow it)
        if spec.name in skip_tensors or (spec.name == "output.weight" and tied):
            continue
        if spec.role in (MATRIX, EXPERTS):
            default = 0.5 if spec.name == "token_embd.weight" else 0.08
            values = rng.normal(0, (std or {}).get(re.sub(r"^blk\.\d+\.", "", spec.name), default), spec.shape)
        else:
            short = re.sub(r"^blk\.\d+\.", "", spec.name)
            spread = (std or {}).get(short, 0.05)
            mean = (center or {}).get(short, 1.0 if spec.role == NORM else 0.0)
            values = (mean + rng.normal(0, spread, spec.shape)).astype(np.float32)
        if spec.name in (fill or {}):
            values[:] = fill[spec.name]
        if spec.role in (MATRIX, EXPERTS):
            matrix_qtype = qtype if spec.role == MATRIX or expert_qtype is None else expert_qtype
            data, raw = _quantized(values, matrix_qtype, rng, block_scales)
            w.add_tensor(spec.name, data, raw_dtype=raw)
        else:
            w.add_tensor(spec.name, values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    return [chr(c) for c in printable] + [chr(256 + i) for i in range(256 - len(printable))]


# A byte-level BPE vocabulary (one token per byte, one merge, the two ChatML markers): the real tokenizer
# code over a vocabulary small enough for tiny random models.
CHATML_TOKENS = _byte_alphabet() + ["hi", "<|im_start|>", "<|im_end|>"]
CHATML_TOKENIZER = {
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "gpt2",
    "tokenizer.ggml.tokens": CHATML_TOKENS,
    "tokenizer.ggml.token_type": [1] * (len(CHATML_TOKENS) - 2) + [3, 3],
    "tokenizer.ggml.merges": ["h i"],
    "tokenizer.ggml.eos_token_id": len(CHATML_TOKENS) - 1,
    "tokenizer.ggml.add_bos_token": False,
}
