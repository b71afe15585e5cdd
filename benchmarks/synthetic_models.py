"""GGUFs of the shapes people run, with random but valid weights, for speed measurements.

Timing does not depend on the weights' values, only on their shapes and block formats, so a file of a real
model's shape with random blocks (small finite f16 scales, tests/quant_weights.py) measures what the real
model would: the same tensor names, shapes and a Q4_K_M-like mix of formats (llama.cpp's choice for that
preset: Q4_K everywhere, Q6_K for the output matrix and for `attn_v` and `ffn_down` on the layers its
`use_more_bits` picks), and the Qwen2.5 starter's tokenizer, so `fucina bench FILE --peer` and llama-bench
read the same file.

    python -m benchmarks.synthetic_models qwen2.5-1.5b OUT.gguf
    fucina bench OUT.gguf --threads 2 --runs 5 --peer

Tensors are drawn and written one at a time, so a 5 GB file needs no more than its largest tensor in memory
(a MoE layer's stacked experts: 0.4 GB for the Qwen3-30B-A3B shape, a 17.7 GB file).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from engine.models import FAMILIES
from engine.models.layout import EXPERTS, MATRIX, NORM
from engine.models.tiny import standard_metadata, write_metadata
from engine.platform.catalog import resolve_model
from tests.quant_weights import random_weight

TOKENIZER_MODEL = "qwen2.5-coder-0.5b-instruct"  # the starter whose tokenizer the files carry
# the blocks' f16 scales: weights of a real model's spread (a few hundredths). Timing does not depend on the
# values, but activations do, and blocks of the test default's scales (up to 0.1: weights up to 12) blow a
# latent attention's scores up until its softmax underflows into subnormals, which run many times slower.
BLOCK_SCALES = (2e-4, 8e-4)
_CENTERS = {"ssm_a": -0.5}  # a Gated DeltaNet layer's decay rates, by the name's last part


@dataclass(frozen=True)
class Shape:
    arch: str
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    tied: bool  # the output product reads token_embd (Qwen2.5 up to 3B)
    context: int = 32768
    head_dim: int | None = None  # None: n_embd / n_head
    experts: tuple[int, int] | None = None  # Mixture-of-Experts: (experts, used per token); n_ff is each one's
    window: int = 0  # the sliding window of the layers that have one (0: the family's default metadata has none)
    preset: str = "Q4_K_M"  # the formats' mix: llama.cpp's Q4_K_M, or gpt-oss's release (MXFP4 experts, Q8_0 else)
    metadata: tuple[tuple[str, object], ...] = ()  # further "<arch>.*" keys (RoPE scaling, ...)
    leave_out: tuple[str, ...] = ()  # endings of the family's optional tensors this model does not have


SHAPES = {
    "qwen2.5-1.5b": Shape("qwen2", 28, 1536, 12, 2, 8960, tied=True),
    "qwen2.5-7b": Shape("qwen2", 28, 3584, 28, 4, 18944, tied=False),
    # Qwen3-30B-A3B: 30.5B parameters, 3.3B per token
    "qwen3-30b-a3b": Shape("qwen3moe", 48, 2048, 32, 4, 768, tied=False, head_dim=128, experts=(128, 8)),
    # gpt-oss-20b: 20.9B parameters, 3.6B per token; its own vocabulary is 201,088 tokens (the file carries the
    # Qwen2.5 starter's 151,936: an output matrix 24% smaller)
    "gpt-oss-20b": Shape("gpt-oss", 24, 2880, 64, 8, 2880, tied=False, context=131072, head_dim=64, experts=(32, 4),
                         window=128, preset="MXFP4", metadata=(
                             ("rope.freq_base", 150000.0), ("rope.scaling.type", "yarn"), ("rope.scaling.factor", 32.0),
                             ("rope.scaling.original_context_length", 4096))),
    # DeepSeek-V2-Lite: 15.7B parameters, 2.4B per token; latent attention (kv_lora_rank 512, heads of 128 + 64
    # RoPE'd dims), a dense first layer (n_ff 10944), then 64 experts of 1408, 6 used, and 2 shared; its own
    # vocabulary is 102,400 tokens (the file carries the Qwen2.5 starter's 151,936: an output 48% larger)
    "deepseek-v2-lite": Shape("deepseek2", 27, 2048, 16, 1, 10944, tied=False, context=163840, head_dim=576,
                              experts=(64, 6), metadata=(
                                  ("expert_feed_forward_length", 1408), ("expert_shared_count", 2),
                                  ("leading_dense_block_count", 1), ("attention.kv_lora_rank", 512),
                                  ("attention.q_lora_rank", 0), ("attention.value_length", 512),
                                  ("attention.key_length_mla", 192), ("attention.value_length_mla", 128),
                                  ("rope.dimension_count", 64), ("rope.freq_base", 10000.0),
                                  ("rope.scaling.type", "yarn"), ("rope.scaling.factor", 40.0),
                                  ("rope.scaling.original_context_length", 4096),
                                  ("rope.scaling.yarn_log_multiplier", 0.0707), ("expert_gating_func", 1),
                                  ("expert_weights_scale", 1.0), ("expert_weights_norm", False))),
    # GLM-4.5-Air (106B parameters, 12B per token) with 16 of its 128 experts in each layer: 46 layers (the first
    # dense, n_ff 10944), then experts of 1408, 8 used, and one shared; attention with biases and no q/k norms,
    # RoPE on half of each head; and its next-token-prediction layer. A token reads what an Air token reads;
    # the file is 12 GB where Air's is 60 (its vocabulary, 151,552 tokens, is about the file's 151,936)
    "glm-4.5-air-16e": Shape("glm4moe", 47, 4096, 96, 8, 10944, tied=False, context=131072, head_dim=128,
                             experts=(16, 8), metadata=(
                                 ("expert_feed_forward_length", 1408), ("expert_shared_count", 1),
                                 ("leading_dense_block_count", 1), ("nextn_predict_layers", 1),
                                 ("rope.dimension_count", 64), ("expert_gating_func", 2),
                                 ("expert_weights_norm", True), ("expert_weights_scale", 1.0)),
                             leave_out=("attn_q_norm.weight", "attn_k_norm.weight")),
    # Qwen3.5-35B-A3B (35B parameters, 3B per token) with 64 of its 256 experts in each layer: 40 layers, every
    # fourth gated full attention (16 heads of 256, 2 KV heads, RoPE on 64 dims), the others Gated DeltaNet (16
    # q/k heads and 32 value heads of 128, a 4-tap conv); in each, experts of 512, 8 used, and a gated shared
    # one of 512. A token reads what a 35B-A3B token reads; the file is 6 GB where the model's is 21 (its
    # vocabulary, 248,320 tokens, is 63% larger than the file's 151,936: its output matrix too)
    "qwen3.5-35b-a3b-64e": Shape("qwen35moe", 40, 2048, 16, 2, 512, tied=False, context=262144, head_dim=256,
                                 experts=(64, 8), metadata=(
                                     ("expert_shared_feed_forward_length", 512), ("full_attention_interval", 4),
                                     ("rope.dimension_count", 64), ("rope.dimension_sections", [11, 11, 10, 0]),
                                     ("rope.freq_base", 10000000.0), ("ssm.conv_kernel", 4),
                                     ("ssm.state_size", 128), ("ssm.group_count", 16), ("ssm.time_step_rank", 32),
                                     ("ssm.inner_size", 4096))),
    # Gemma 4 26B-A4B (25B parameters, 4B per token; its GGUF metadata as llama.cpp's converter writes it) with 32
    # of its 128 experts in each layer: 30 layers, every sixth full attention (16 heads of 512, 2 KV heads, V
    # normed, proportional RoPE) and the others a 1024-token window (heads of 256, 8 KV heads); in each a dense
    # GeGLU MLP of 2112 and experts of 704 (not whole K-quant blocks: Q5_0, as llama.cpp's Q4_K_M falls back),
    # 8 used. A token reads what a 26B-A4B token reads; the file's vocabulary is the Qwen2.5 starter's 151,936
    # where the model's is 262,144 (its output matrix 42% smaller), and it holds an output matrix of its own
    "gemma-4-26b-a4b-32e": Shape("gemma4", 30, 2816, 16, 8, 2112, tied=False, context=262144, head_dim=512,
                                 window=1024, experts=(32, 8), metadata=(
                                     ("expert_feed_forward_length", 704), ("attention.key_length_swa", 256),
                                     ("attention.value_length_swa", 256), ("rope.dimension_count", 512),
                                     ("rope.dimension_count_swa", 256), ("rope.freq_base_swa", 10000.0),
                                     ("attention.head_count_kv", [8, 8, 8, 8, 8, 2] * 5),
                                     ("attention.sliding_window_pattern", ([True] * 5 + [False]) * 5),
                                     ("final_logit_softcapping", 30.0), ("attention.shared_kv_layers", 0),
                                     ("embedding_length_per_layer_input", 0))),
}
# GLM-4.5-Air with 48 of its 128 experts: a 30.5 GB file, for streaming experts from a file larger than memory
SHAPES["glm-4.5-air-48e"] = replace(SHAPES["glm-4.5-air-16e"], experts=(48, 8))


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v and ffn_down get more bits in its _M presets."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


# llama.cpp's fallback for a K-quant whose rows are not whole 256-value super-blocks (MLA's attn_k_b rows of 128)
_K_QUANT_FALLBACK = {T.Q4_K: T.Q5_0, T.Q6_K: T.Q8_0}


def matrix_type(shape: Shape, name: str, cols: int) -> T:
    """The block format a matrix of `cols` columns gets in the shape's preset."""
    if shape.preset == "MXFP4":  # ggml-org's gpt-oss GGUFs: the experts as released, the rest Q8_0
        return T.MXFP4 if "_exps." in name else T.F32 if name.endswith("ffn_gate_inp.weight") else T.Q8_0
    if name.endswith(("attn_k_b.weight", "attn_v_b.weight")):
        return T.Q8_0  # MLA's per-head products: llama.cpp's CPU graph has no backend for them in K-quants
    qtype = q4_k_m_type(name, shape.n_layers, shape.tied)
    return _K_QUANT_FALLBACK.get(qtype, qtype) if cols % 256 else qtype


def q4_k_m_type(name: str, n_layers: int, tied: bool) -> T:
    """The block format llama.cpp's Q4_K_M gives a matrix (output: Q6_K; token_embd too when it is the output;
    a MoE router stays F32, as llama.cpp never quantizes one)."""
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return T.Q6_K
    if name.endswith("ffn_gate_inp.weight"):
        return T.F32
    if (name.endswith(("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight"))
            and use_more_bits(int(name.split(".")[1]), n_layers)):
        return T.Q6_K
    return T.Q4_K


def _tokenizer_fields(writer: gguf.GGUFWriter) -> int:
    """Copy the tokenizer (and chat template) of the starter into writer; returns its vocabulary size."""
    reader = gguf.GGUFReader(str(resolve_model(TOKENIZER_MODEL, pull_missing=True)))
    vocab = 0
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            value, sub = field.contents(), field.types[-1]
            writer.add_array(field.name, value) if sub == gguf.GGUFValueType.STRING else \
                writer.add_key_value(field.name, value, kind, sub_type=sub)
            if field.name == "tokenizer.ggml.tokens":
                vocab = len(value)
        else:
            writer.add_key_value(field.name, field.contents(), kind)
    return vocab


def write_synthetic(shape_name: str, path: Path, seed: int = 0) -> Path:
    shape = SHAPES[shape_name]
    writer = gguf.GGUFWriter(str(path), shape.arch)
    writer.add_name(f"synthetic {shape_name}")
    vocab = _tokenizer_fields(writer)
    meta = standard_metadata(shape.arch, n_layers=shape.n_layers, n_embd=shape.n_embd, n_head=shape.n_head,
                             n_head_kv=shape.n_head_kv, n_ff=shape.n_ff, vocab=vocab, context=shape.context,
                             head_dim=shape.head_dim, window=shape.window)
    meta = {k: v for k, v in meta.items() if shape.window or not k.endswith(".sliding_window")} | {
        f"{shape.arch}.rope.freq_base": 1000000.0}
    if shape.experts:
        n_expert, n_used = shape.experts
        meta |= {f"{shape.arch}.expert_count": n_expert, f"{shape.arch}.expert_used_count": n_used,
                 f"{shape.arch}.expert_feed_forward_length": shape.n_ff}
    meta |= {f"{shape.arch}.{k}": v for k, v in shape.metadata}  # the shape's own keys have the last word
    write_metadata(writer, meta)
    specs = [s for s in FAMILIES[shape.arch](meta).tensors()
             if (s.required or not shape.tied) and not s.name.endswith(shape.leave_out)]
    formats = {}
    for spec in specs:
        if spec.role in (MATRIX, EXPERTS):
            *outer, cols = spec.shape  # (rows, cols), or (experts or heads, rows, cols)
            qtype = matrix_type(shape, spec.name, cols)
            block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
            row_bytes = cols * block_bytes // block_elems
            writer.add_tensor_info(spec.name, (*outer, row_bytes), np.dtype(np.uint8),
                                   int(np.prod(outer)) * row_bytes, raw_dtype=qtype)
            formats[spec.name] = qtype
        else:
            writer.add_tensor_info(spec.name, spec.shape, np.dtype(np.float32), 4 * int(np.prod(spec.shape)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for spec in specs:
        if spec.name in formats:  # stacked experts: drawn as one matrix of every expert's rows
            *outer, cols = spec.shape
            weight = random_weight(formats[spec.name], int(np.prod(outer)), cols, rng, BLOCK_SCALES)
            if spec.name.endswith("ffn_gate_inp.weight"):
                weight = _skewed_router(weight.view(np.float32), rng).view(np.uint8)
            writer.write_tensor_data(weight.reshape(*outer, -1))
        else:  # norms near 1, the other vectors near 0, and decay rates (-exp(A_log)) negative
            base = _CENTERS.get(spec.name.split(".")[-1], 1.0 if spec.role == NORM else 0.0)
            writer.write_tensor_data((base + rng.normal(0, 0.05, spec.shape)).astype(np.float32))
    writer.close()
    return path


# a router row's scale by its expert's rank of popularity r (a random order per layer): (r + 1) ** -ROUTER_SKEW. A
# random router picks every expert about as often; real ones have hot and cold experts, which is what a cache of
# experts streamed from disk lives on (at 0.25, top 8 of 128 of independent logits: the hottest expert chosen 6x
# as often as the median one, the 16 hottest a third of the picks)
ROUTER_SKEW = 0.25


def _skewed_router(rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A router's rows [n_expert, n_embd] scaled by a power law over a random order of its experts."""
    rank = rng.permutation(rows.shape[0])
    return (rows * ((rank + 1.0) ** -ROUTER_SKEW)[:, None]).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(write_synthetic(args.shape, args.out, args.seed))


if __name__ == "__main__":
    main()
