"""Tiny random qwen3moe, gpt-oss, deepseek2 and glm4moe GGUFs: the tests' models and the llama.cpp oracle's input
(tests/data/moe/record_llama_logits.py writes the same files through here, ORACLE_MODELS, and records
llama.cpp's logits).

Two layers of 8 experts, top-2, over the byte-level ChatML vocabulary (a tokenizer llama.cpp loads).
Widths are 256 so the experts' rows are whole K-quant super-blocks. The router's spread is large enough
that each row's k-th and (k+1)-th expert are far apart compared with the rounding of the two forwards
(otherwise llama.cpp and the engine could pick different experts and the comparison would say nothing);
the other matrices keep the writer's default spread, but for the embedding (tied to the output: logits of
a real model's spread). Everything but the experts is F32.

Even so a random router puts some rows near a tie, so the seed is the one of the first 40 with the widest
margins: every row's k-th router logit beats its (k+1)-th by at least 3% of the row's spread (the
smallest gap of the other seeds: 0.1%-3%; near 0.1% llama.cpp and the engine route a row differently).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from tests.synthetic import CHATML_TOKENS, write_tiny_model

ARCH = "qwen3moe"
N_LAYERS, N_EXPERT, N_USED, N_FF_EXP = 2, 8, 2, 256
ROUTER_STD = 0.25  # router logits of normed rows spread ~ 0.25 * sqrt(256) = 4
EMBED_STD = 0.15  # logits (tied output) spread ~ 0.15 * sqrt(256) = 2.4, as a real model's
# Random Q4_K blocks' scales: weights of about the default spread (larger ones overflow the activations)
Q4_K_BLOCK_SCALES = (2e-4, 8e-4)

SEED = 10
# Every router row zero: all experts tie in every row, and the top k are the k lowest indices if the tie
# order is llama.cpp's (its stable sort of few experts).
TIED_ROUTERS = {f"blk.{i}.ffn_gate_inp.weight": 0.0 for i in range(N_LAYERS)}
# variant name -> (the experts' format, what else its file has otherwise)
VARIANTS = {"f32": (T.F32, {}), "q8_0": (T.Q8_0, {}), "q4_k": (T.Q4_K, {}),
            "f32-tied-routers": (T.F32, {"fill": TIED_ROUTERS})}

# The token ids fed to both forwards: a fixed random sequence over the vocabulary.
TOKENS = [int(t) for t in np.random.default_rng(26).integers(0, len(CHATML_TOKENS), 32)]


def moe_metadata(n_expert: int = N_EXPERT, n_used: int = N_USED, n_ff_exp: int = N_FF_EXP) -> dict:
    return {f"{ARCH}.expert_count": n_expert, f"{ARCH}.expert_used_count": n_used,
            f"{ARCH}.expert_feed_forward_length": n_ff_exp}


def write_moe_model(path: Path | str, variant: str = "f32", *, seed: int = SEED, **overrides) -> None:
    """The tiny qwen3moe model of `variant` (a key of VARIANTS); `overrides` go to write_tiny_model (a
    hostile file: other metadata, left-out tensors)."""
    expert_qtype, variant_kwargs = VARIANTS[variant]
    kwargs = {"n_layers": N_LAYERS, "n_embd": 256, "n_head": 4, "n_head_kv": 2, "n_ff": N_FF_EXP * N_USED,
              "qtype": T.F32, "expert_qtype": expert_qtype, "block_scales": Q4_K_BLOCK_SCALES,
              "std": {"ffn_gate_inp.weight": ROUTER_STD, "token_embd.weight": EMBED_STD},
              "family_metadata": moe_metadata(), "tokenizer": True, "tokenizer_pre": "qwen2", "seed": seed}
    write_tiny_model(path, ARCH, **(kwargs | variant_kwargs | overrides))


# gpt-oss: a sliding (0) and a global (1) layer of the same sizes and routing, a window of 8 keys so that the
# 32 fed ids reach past it, YaRN (factor 8 over 64 original positions: its ramp spans the first 9 pairs);
# experts F32 or MXFP4 (gguf.quants' quantization of the drawn values). Its seed is chosen as qwen3moe's.
GPT_OSS = "gpt-oss"
GPT_OSS_WINDOW = 8
GPT_OSS_SEED = 0
GPT_OSS_VARIANTS = {"f32": T.F32, "mxfp4": T.MXFP4}


def gpt_oss_metadata() -> dict:
    keys = {"expert_count": N_EXPERT, "expert_used_count": N_USED, "expert_feed_forward_length": N_FF_EXP,
            "rope.scaling.type": "yarn", "rope.scaling.factor": 8.0, "rope.scaling.original_context_length": 64}
    return {f"{GPT_OSS}.{k}": v for k, v in keys.items()}


def write_gpt_oss_model(path: Path | str, variant: str = "f32", *, seed: int = GPT_OSS_SEED, **overrides) -> None:
    """The tiny gpt-oss model of `variant` (a key of GPT_OSS_VARIANTS); `overrides` as write_moe_model's."""
    kwargs = {"n_layers": N_LAYERS, "n_embd": 256, "n_head": 4, "n_head_kv": 2, "n_ff": N_FF_EXP * N_USED,
              "qtype": T.F32, "expert_qtype": GPT_OSS_VARIANTS[variant], "window": GPT_OSS_WINDOW,
              "std": {"ffn_gate_inp.weight": ROUTER_STD, "token_embd.weight": EMBED_STD},
              "family_metadata": gpt_oss_metadata(), "tokenizer": True, "tokenizer_pre": "qwen2", "seed": seed,
              "tied": False}  # llama.cpp requires output.weight for gpt-oss
    write_tiny_model(path, GPT_OSS, **(kwargs | overrides))


# What the llama.cpp oracle records: file name (tests/data/moe/<name>.json) -> (its writer, the experts'
# format, the variant)
ORACLE_MODELS = {
    **{f"{ARCH}-{v}": (partial(write_moe_model, variant=v), qtype, v) for v, (qtype, _) in VARIANTS.items()},
    **{f"{GPT_OSS}-{v}": (partial(write_gpt_oss_model, variant=v), qtype, v) for v, qtype in GPT_OSS_VARIANTS.items()},
}


# deepseek2: a dense leading layer, then two MoE layers with a shared expert; latent attention (rank 64, heads of
# 32 + 16 RoPE'd dims, values of 32) with YaRN (factor 4 over 16 original positions, DeepSeek's mscale_all_dim
# 0.707). "lite" is DeepSeek-V2-Lite's layout (the query straight from x, softmax gating, the weights neither
# normalized nor scaled); "unsplit" the same as an older conversion writes it (attn_kv_b, the plain head sizes);
# "v3" DeepSeek-V3's (a low-rank query, sigmoid gating with the selection bias exp_probs_b, the experts chosen in
# the best 2 of 4 groups, normalized weights scaled by 2.5). Experts F32 or quantized.
DEEPSEEK2 = "deepseek2"
DEEPSEEK2_SHAPE = {"kv_lora_rank": 64, "nope": 32, "rope": 16, "v": 32, "q_lora_rank": 64}
DEEPSEEK2_LAYOUTS = {
    "lite": {"attention.q_lora_rank": 0, "expert_gating_func": 1, "expert_weights_norm": False,
             "expert_weights_scale": 1.0},
    "unsplit": {"attention.q_lora_rank": 0, "expert_gating_func": 1, "expert_weights_norm": False,
                "expert_weights_scale": 1.0},
    "v3": {"attention.q_lora_rank": DEEPSEEK2_SHAPE["q_lora_rank"], "expert_gating_func": 2,
           "expert_weights_norm": True, "expert_weights_scale": 2.5, "expert_group_count": 4,
           "expert_group_used_count": 2},
}
# variant -> (layout, the experts' format, the other matrices' format)
DEEPSEEK2_VARIANTS = {"lite-f32": ("lite", T.F32, T.F32), "lite-q8_0": ("lite", T.Q8_0, T.F32),
                      "v3-f32": ("v3", T.F32, T.F32), "v3-q4_k": ("v3", T.Q4_K, T.F32),
                      "unsplit-f32": ("unsplit", T.F32, T.F32), "unsplit-q8_0": ("unsplit", T.Q8_0, T.F32)}
# per layout, a seed whose rows route clear of ties in both its variants (of the first 12: max |Δ| from
# llama.cpp's logits smallest, the top-1 the same wherever llama.cpp's is clear)
DEEPSEEK2_SEEDS = {"lite": 3, "v3": 5, "unsplit": 3}
SELECTION_BIAS_STD = 0.3  # exp_probs_b of the spread of the sigmoid's probabilities: it changes what is chosen


def deepseek2_metadata(layout: str) -> dict:
    s = DEEPSEEK2_SHAPE
    if layout == "unsplit":  # an older conversion: plain key and value lengths, attn_kv_b, run by llama.cpp as MHA
        heads = {"attention.head_count_kv": 4, "attention.key_length": s["nope"] + s["rope"],
                 "attention.value_length": s["v"]}
    else:
        heads = {"attention.head_count_kv": 1, "attention.key_length": s["kv_lora_rank"] + s["rope"],
                 "attention.value_length": s["kv_lora_rank"], "attention.key_length_mla": s["nope"] + s["rope"],
                 "attention.value_length_mla": s["v"]}
    keys = {"leading_dense_block_count": 1, "expert_count": N_EXPERT, "expert_used_count": N_USED,
            "expert_shared_count": 1, "expert_feed_forward_length": N_FF_EXP,
            "attention.kv_lora_rank": s["kv_lora_rank"], **heads, "rope.dimension_count": s["rope"], "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
            "rope.scaling.original_context_length": 16, "rope.scaling.yarn_log_multiplier": 0.0707,
            **DEEPSEEK2_LAYOUTS[layout]}
    return {f"{DEEPSEEK2}.{k}": v for k, v in keys.items()}


def write_deepseek2_model(path: Path | str, variant: str = "lite-f32", *, seed: int | None = None,
                          **overrides) -> None:
    """The tiny deepseek2 model of `variant` (a key of DEEPSEEK2_VARIANTS); `overrides` as write_moe_model's."""
    layout, expert_qtype, qtype = DEEPSEEK2_VARIANTS[variant]
    seed = DEEPSEEK2_SEEDS[layout] if seed is None else seed
    skip = () if layout == "v3" else tuple(f"blk.{i}.exp_probs_b.bias" for i in range(3))
    kwargs = {"n_layers": 3, "n_embd": 256, "n_head": 4, "n_head_kv": 1, "n_ff": 512, "qtype": qtype,
              "expert_qtype": expert_qtype, "block_scales": Q4_K_BLOCK_SCALES,
              "std": {"ffn_gate_inp.weight": ROUTER_STD, "token_embd.weight": EMBED_STD,
                      "exp_probs_b.bias": SELECTION_BIAS_STD},
              "family_metadata": deepseek2_metadata(layout), "tokenizer": True, "tokenizer_pre": "qwen2",
              "seed": seed, "skip_tensors": skip}
    write_tiny_model(path, DEEPSEEK2, **(kwargs | overrides))


ORACLE_MODELS |= {f"{DEEPSEEK2}-{v}": (partial(write_deepseek2_model, variant=v), expert_qtype, v)
                  for v, (_, expert_qtype, _) in DEEPSEEK2_VARIANTS.items()}


# glm4moe: a dense leading layer, then two MoE layers with a shared expert, sigmoid gating with the selection
# bias, normalized weights scaled by 1.8; attention with q/k/v biases and NeoX RoPE on half of each head's 64
# dims. "air" is GLM-4.5-Air's (no q/k norms), "qk-norm" GLM-4.5's (q/k norms).
GLM4MOE = "glm4moe"
GLM4MOE_VARIANTS = {"air-f32": ("air", T.F32), "air-q4_k": ("air", T.Q4_K), "qk-norm-f32": ("qk-norm", T.F32)}
GLM4MOE_SEED = 7  # of the first 12, the one whose variants route clear of ties (max |Δ| smallest, top-1 the same)


def glm4moe_metadata(n_next_token: int = 0) -> dict:
    keys = {"leading_dense_block_count": 1, **({"nextn_predict_layers": n_next_token} if n_next_token else {}), "expert_count": N_EXPERT, "expert_used_count": N_USED,
            "expert_shared_count": 1, "expert_feed_forward_length": N_FF_EXP, "rope.dimension_count": 32,
            "expert_gating_func": 2, "expert_weights_norm": True, "expert_weights_scale": 1.8}
    return {f"{GLM4MOE}.{k}": v for k, v in keys.items()}


def write_glm4moe_model(path: Path | str, variant: str = "air-f32", *, seed: int = GLM4MOE_SEED,
                        next_token: bool = False, **overrides) -> None:
    """The tiny glm4moe model of `variant` (a key of GLM4MOE_VARIANTS), with a fourth layer for next-token
    prediction (MTP, its tensors after the model's, which are those of the model without it) where
    `next_token`; `overrides` as write_moe_model's."""
    layout, expert_qtype = GLM4MOE_VARIANTS[variant]
    n_layers = 4 if next_token else 3
    norms = () if layout == "qk-norm" else tuple(f"blk.{i}.attn_{t}_norm.weight" for i in range(n_layers) for t in "qk")
    kwargs = {"n_layers": n_layers, "n_embd": 256, "n_head": 4, "n_head_kv": 2, "n_ff": 512, "qtype": T.F32,
              "expert_qtype": expert_qtype, "block_scales": Q4_K_BLOCK_SCALES,
              "std": {"ffn_gate_inp.weight": ROUTER_STD, "token_embd.weight": EMBED_STD,
                      "exp_probs_b.bias": SELECTION_BIAS_STD},
              "family_metadata": glm4moe_metadata(int(next_token)), "tokenizer": True, "tokenizer_pre": "qwen2",
              "seed": seed, "skip_tensors": norms}
    write_tiny_model(path, GLM4MOE, **(kwargs | overrides))


ORACLE_MODELS |= {f"{GLM4MOE}-{v}": (partial(write_glm4moe_model, variant=v), expert_qtype, v)
                  for v, (_, expert_qtype) in GLM4MOE_VARIANTS.items()}
# with the next-token-prediction layer: llama.cpp loads it and leaves it out of the forward, as the engine does
ORACLE_MODELS |= {f"{GLM4MOE}-{v}-mtp": (partial(write_glm4moe_model, variant=v, next_token=True), expert_qtype, v)
                  for v, (_, expert_qtype) in GLM4MOE_VARIANTS.items() if v.startswith("air")}


def assert_refused(write, tmp_path, error, match, **overrides) -> None:
    """The model `write` writes (with `overrides`) is refused at load with `error`, its message matching `match`."""
    import pytest

    from engine.models import load_model

    path = tmp_path / "m.gguf"
    write(path, **overrides)
    with pytest.raises(error, match=match):
        load_model(path)
