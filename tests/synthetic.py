"""Tiny random GGUF models for every family, written with gguf.GGUFWriter."""

from __future__ import annotations

import numpy as np
import gguf
from gguf.constants import GGMLQuantizationType as T

from tests.quant_weights import random_weight

FAMILY_TENSORS = {
    "llama": dict(bias=False, qk_norm=False, post_norms=False),
    "qwen2": dict(bias=True, qk_norm=False, post_norms=False),
    "qwen3": dict(bias=False, qk_norm=True, post_norms=False),
    "gemma3": dict(bias=False, qk_norm=True, post_norms=True),
}


# gguf.quants cannot quantize these: their weights are random blocks (tests.quant_weights)
_RANDOM_BLOCK_TYPES = {T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL}


def _quantized(arr: np.ndarray, qtype: T, rng: np.random.Generator):
    """(data, raw_dtype) for add_tensor: F32 as is, K-quants random blocks of the same shape, others
    pre-quantized by gguf.quants."""
    if qtype == T.F32:
        return arr.astype(np.float32), None
    if qtype in _RANDOM_BLOCK_TYPES:
        return random_weight(qtype, *arr.shape, rng), qtype
    return gguf.quants.quantize(arr.astype(np.float32), qtype), qtype


def write_tiny_model(path, arch: str = "llama", *, n_layers: int = 2, n_embd: int = 64, n_head: int = 4,
                     n_head_kv: int = 2, head_dim: int | None = None, n_ff: int = 96, vocab: int = 128,
                     qtype: T = T.Q8_0, tied: bool = True, window: int = 8, seed: int = 0,
                     metadata: dict | None = None, skip_tensors: tuple = ()) -> None:
    rng = np.random.default_rng(seed)
    hd = head_dim or n_embd // n_head
    flags = FAMILY_TENSORS[arch]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layers)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_context_length(256)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)
    if head_dim:
        w.add_key_length(hd)
        w.add_value_length(hd)
    if arch == "gemma3":
        w.add_sliding_window(window)
    for k, v in (metadata or {}).items():
        w.add_key_value(k, v[0], v[1])

    def mat(name, rows, cols, scale=0.08):
        if name in skip_tensors:
            return
        data, raw = _quantized(rng.normal(0, scale, (rows, cols)), qtype, rng)
        w.add_tensor(name, data, raw_dtype=raw)

    def vec(name, n, center=1.0):
        if name not in skip_tensors:
            w.add_tensor(name, (center + rng.normal(0, 0.05, n)).astype(np.float32))

    mat("token_embd.weight", vocab, n_embd, 0.5)
    if not tied:
        mat("output.weight", vocab, n_embd)
    vec("output_norm.weight", n_embd)
    for i in range(n_layers):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", n_embd)
        mat(p + "attn_q.weight", n_head * hd, n_embd)
        mat(p + "attn_k.weight", n_head_kv * hd, n_embd)
        mat(p + "attn_v.weight", n_head_kv * hd, n_embd)
        mat(p + "attn_output.weight", n_embd, n_head * hd)
        if flags["bias"]:
            for t, n in (("q", n_head * hd), ("k", n_head_kv * hd), ("v", n_head_kv * hd)):
                vec(p + f"attn_{t}.bias", n, 0.0)
        if flags["qk_norm"]:
            vec(p + "attn_q_norm.weight", hd)
            vec(p + "attn_k_norm.weight", hd)
        if flags["post_norms"]:
            vec(p + "post_attention_norm.weight", n_embd)
            vec(p + "post_ffw_norm.weight", n_embd)
        vec(p + "ffn_norm.weight", n_embd)
        mat(p + "ffn_gate.weight", n_ff, n_embd)
        mat(p + "ffn_up.weight", n_ff, n_embd)
        mat(p + "ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
