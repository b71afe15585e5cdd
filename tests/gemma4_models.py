"""Tiny random gemma4 GGUFs: the tests' models and the llama.cpp oracle's input (tests/data/moe/record_llama_logits.py
writes them through here, GEMMA4_ORACLE_MODELS).

Two layouts of Gemma 4's variants:
- "e" (as E2B / E4B): six layers alternating sliding-window (window 8, heads of 64, 2 KV heads) and full
  attention (heads of 128, 1 KV head, RoPE "proportional": rope_freqs turn the first quarter of the pairs and
  divide the others' angles by 1e30); the last two layers keep no KV rows and attend to layers 2 and 3's;
  per-layer embeddings of 256 per layer; a layer output scale; logits soft-capped at 30.
- "moe" (as 26B-A4B): four layers, the last full and without attn_v (V from the K product), each with the dense
  MLP and 8 experts (top 2, GeGLU, scaled per expert) routed from rms_norm(x) / sqrt(n_embd) * scale: the
  router's spread is 16 (sqrt(n_embd)) times the MoE models' so its logits spread as theirs.
Widths of 256 keep every matrix's rows whole K-quant super-blocks; matrices F32 or Q4_K (the "moe" layout's
experts only). The embedding is tied to the output, with a real model's logit spread.
"""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from tests.moe_models import EMBED_STD, N_EXPERT, N_USED, Q4_K_BLOCK_SCALES, ROUTER_STD
from tests.synthetic import write_tiny_model

GEMMA4 = "gemma4"
HEAD_SWA, HEAD_FULL = 64, 128
ROTATED_PAIRS = HEAD_FULL // 8  # partial_rotary_factor 0.25 of the full layers' 64 pairs
ROPE_FREQS = np.array([1.0] * ROTATED_PAIRS + [1e30] * (HEAD_FULL // 2 - ROTATED_PAIRS), np.float32)
LAYOUTS = {
    "e": {"n_layers": 6, "sliding": [True, False] * 3, "shared_kv": 2, "per_layer": 256, "experts": False},
    "moe": {"n_layers": 4, "sliding": [True, True, True, False], "shared_kv": 0, "per_layer": 0, "experts": True},
}
# variant -> (layout, the matrices' format, the experts')
GEMMA4_VARIANTS = {"e-f32": ("e", T.F32, None), "e-q4_k": ("e", T.Q4_K, None),
                   "moe-f32": ("moe", T.F32, T.F32), "moe-q4_k": ("moe", T.F32, T.Q4_K)}
GEMMA4_SEEDS = {"e": 1, "moe": 3}  # moe: of the first 8, the one whose Q4_K variant routes clear of ties


def gemma4_metadata(layout: str) -> dict:
    shape = LAYOUTS[layout]
    sliding = shape["sliding"]
    keys = {"attention.sliding_window_pattern": sliding, "attention.key_length": HEAD_FULL,
            "attention.value_length": HEAD_FULL, "attention.key_length_swa": HEAD_SWA,
            "attention.value_length_swa": HEAD_SWA, "attention.head_count_kv": [2 if s else 1 for s in sliding],
            "rope.dimension_count": HEAD_FULL, "rope.dimension_count_swa": HEAD_SWA, "rope.freq_base": 1e6,
            "rope.freq_base_swa": 1e4, "attention.shared_kv_layers": shape["shared_kv"],
            "embedding_length_per_layer_input": shape["per_layer"], "final_logit_softcapping": 30.0}
    if shape["experts"]:
        keys |= {"expert_count": N_EXPERT, "expert_used_count": N_USED, "expert_feed_forward_length": 256}
    return {f"{GEMMA4}.{k}": v for k, v in keys.items()}


def write_gemma4_model(path: Path | str, variant: str = "e-f32", *, seed: int | None = None, **overrides) -> None:
    """The tiny gemma4 model of `variant` (a key of GEMMA4_VARIANTS); `overrides` go to write_tiny_model (a
    hostile file: other metadata, left-out tensors)."""
    layout, qtype, expert_qtype = GEMMA4_VARIANTS[variant]
    shape = LAYOUTS[layout]
    no_value = tuple(f"blk.{i}.attn_v.weight" for i, s in enumerate(shape["sliding"]) if not s and shape["experts"])
    kwargs = {"n_layers": shape["n_layers"], "n_embd": 256, "n_head": 4, "n_head_kv": 2, "n_ff": 512, "window": 8,
              "qtype": qtype, "expert_qtype": expert_qtype, "block_scales": Q4_K_BLOCK_SCALES,
              "std": {"token_embd.weight": EMBED_STD, "ffn_gate_inp.weight": ROUTER_STD * 16},
              "fill": {"rope_freqs.weight": ROPE_FREQS}, "family_metadata": gemma4_metadata(layout),
              "tokenizer": True, "tokenizer_pre": "qwen2", "skip_tensors": no_value,
              "seed": GEMMA4_SEEDS[layout] if seed is None else seed}
    write_tiny_model(path, GEMMA4, **(kwargs | overrides))


GEMMA4_ORACLE_MODELS = {f"{GEMMA4}-{v}": (partial(write_gemma4_model, variant=v), expert or qtype, v)
                        for v, (_, qtype, expert) in GEMMA4_VARIANTS.items()}


# A tiny vocabulary of Gemma 4's kind (tokenizer.ggml.model "gemma4": SentencePiece-style BPE): its control
# tokens, the 256 <0xXX> byte tokens, every character of GEMMA4_CORPUS (spaces as "▁") and the merges a
# plain BPE trainer learns from the corpus's words, most frequent pair first (ties: the greatest pair).
GEMMA4_CORPUS = ("The quick brown fox jumps over the lazy dog.\n\nHello world! Hello there, world.\n"
                 "  an indented line\twith a tab\nCafé über naïve résumé\n\n\nnumbers 12345 and 678 then 90\n")
GEMMA4_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", "<|tool_response>", "</s>")
GEMMA4_MERGES = 160


def gemma4_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of the tiny Gemma 4-style vocabulary."""
    from collections import Counter

    # trained within words (a "▁" and the letters after it), as a real vocabulary's merges mostly are
    words = re.findall("\u2581?[^\u2581\n]+|\u2581+|\n+", GEMMA4_CORPUS.replace(" ", "\u2581"))
    symbols = [list(w) for w in words]
    pieces = sorted({c for w in words for c in w})
    merges = []
    for _ in range(GEMMA4_MERGES):
        counts = Counter(pair for s in symbols for pair in zip(s, s[1:]))
        if not counts:
            break
        (a, b), _ = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append(f"{a} {b}")
        if a + b not in pieces:
            pieces.append(a + b)
        symbols = [_merged(s, a, b) for s in symbols]
    tokens = [*GEMMA4_SPECIALS, *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    types = [3] * len(GEMMA4_SPECIALS) + [6] * 256 + [1] * len(pieces)  # CONTROL, BYTE, NORMAL
    return tokens, types, merges


def _merged(symbols: list[str], a: str, b: str) -> list[str]:
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and symbols[i] == a and symbols[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def write_gemma4_vocab(path: Path | str) -> None:
    """A vocabulary-only GGUF of the tiny Gemma 4-style vocabulary (llama.cpp loads it with vocab_only), with
    the "e" layout's model metadata."""
    import gguf

    from engine.models import tiny

    tokens, types, merges = gemma4_vocab()
    writer = gguf.GGUFWriter(str(path), GEMMA4)
    meta = tiny.standard_metadata(GEMMA4, n_layers=6, n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                                  vocab=len(tokens), window=8)
    tiny.write_metadata(writer, meta | gemma4_metadata("e"))
    writer.add_tokenizer_model("gemma4")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# What llama.cpp's tokenization of the tiny vocabulary is recorded on (tests/data/moe/record_llama_tokens.py):
# words of the corpus and others, characters outside the vocabulary (their bytes), runs of newlines and spaces,
# control tokens written in the text
GEMMA4_TOKENIZER_TEXTS = (
    "Hello world", " Hello world", "Hello, world!", "The lazy fox jumps over the brown dog.",
    "  two  spaces and\ttabs\t\there", "\n", "\n\n", "\n\n\n\n\n", "a\n\nb\n", "Café über naïve résumé",
    "λ and 🦙 are not in it", "numbers 1234567890", "<|turn>user\nHello there<turn|>\n<|turn>model\n",
    "it ends</s> here<eos>", "",
)
