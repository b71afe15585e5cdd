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
                     metadata: dict | None = None, skip_tensors: tuple = (), tokenizer: bool = False,
                     fill: dict | None = None) -> None:
    """`metadata` maps keys to (value, GGUFValueType), added last so they override the standard ones;
    `tokenizer` adds CHATML_TOKENIZER (and sizes the vocabulary for it); `fill` sets 1-D tensors (norms,
    biases) to a constant (a NaN weight, an overflow)."""
    rng = np.random.default_rng(seed)
    if tokenizer:
        vocab = len(CHATML_TOKENS)
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
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt2")
        w.add_token_list(CHATML_TOKENIZER["tokenizer.ggml.tokens"])
        w.add_token_types(CHATML_TOKENIZER["tokenizer.ggml.token_type"])
        w.add_token_merges(CHATML_TOKENIZER["tokenizer.ggml.merges"])
        w.add_eos_token_id(CHATML_TOKENIZER["tokenizer.ggml.eos_token_id"])
        w.add_add_bos_token(False)
    for k, v in (metadata or {}).items():
        w.add_key_value(k, v[0], v[1])

    def mat(name, rows, cols, scale=0.08):
        if name in skip_tensors:
            return
        data, raw = _quantized(rng.normal(0, scale, (rows, cols)), qtype, rng)
        w.add_tensor(name, data, raw_dtype=raw)

    def vec(name, n, center=1.0):
        if name not in skip_tensors:
            values = (center + rng.normal(0, 0.05, n)).astype(np.float32)
            if name in (fill or {}):
                values[:] = fill[name]
            w.add_tensor(name, values)

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
