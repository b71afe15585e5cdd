"""Tiny random qwen35 and qwen35moe GGUFs (Gated DeltaNet hybrids): the tests' models and the llama.cpp oracle's input
(tests/data/moe/record_llama_logits.py writes them through here, HYBRID_ORACLE_MODELS, beside the MoE ones).

Four layers alternating DeltaNet (0, 2) and gated full attention (1, 3: `full_attention_interval` 2); 4 q/k
heads and 8 value heads of 32 dims in the DeltaNet layers (each value head reads q/k head h % 4, as
llama.cpp's), a 4-tap conv; attention of 4 query and 2 KV heads of 64 dims, RoPE over the first 16
(multi-axis sections [3, 3, 2, 0]: every pair on a text axis). Widths of 256 keep every matrix's rows whole
K-quant super-blocks. `ssm_a` is centred at -0.5 (A = -exp(A_log) < 0: each state decays) and the conv
kernel spreads as a trained one's. The embedding is tied to the output, with a real model's logit spread.
qwen35moe has the same layers with experts in every one (8 of 256, top 2, routers spread as tests/moe_models.py
says) and a shared expert of 256 gated per row; its seed is the one of the first 12 whose variants route
clear of ties (as the MoE models').
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from gguf.constants import GGMLQuantizationType as T

from tests.moe_models import EMBED_STD, N_EXPERT, N_FF_EXP, N_USED, Q4_K_BLOCK_SCALES, ROUTER_STD
from tests.synthetic import write_tiny_model

QWEN35 = "qwen35"
N_LAYERS = 4
QWEN35_VARIANTS = {"f32": T.F32, "q4_k": T.Q4_K}
QWEN35_SEED = 3


def qwen35_metadata(arch: str = QWEN35) -> dict:
    keys = {"attention.key_length": 64, "attention.value_length": 64, "rope.dimension_count": 16,
            "rope.dimension_sections": [3, 3, 2, 0], "full_attention_interval": 2, "ssm.conv_kernel": 4,
            "ssm.state_size": 32, "ssm.group_count": 4, "ssm.time_step_rank": 8, "ssm.inner_size": 8 * 32}
    return {f"{arch}.{k}": v for k, v in keys.items()}


def write_qwen35_model(path: Path | str, variant: str = "f32", *, seed: int = QWEN35_SEED, arch: str = QWEN35,
                       next_token: bool = False, **overrides) -> None:
    """The tiny qwen35 model of `variant` (a key of QWEN35_VARIANTS: the matrices' format), with a fifth layer
    for next-token prediction (MTP: gated attention, its tensors after the model's, which are those of the model
    without it; no shared_head_norm, as Qwen3.5's may leave out) where `next_token`; `overrides` go to
    write_tiny_model (a hostile file: other metadata, left-out tensors)."""
    family = qwen35_metadata(arch) | ({f"{arch}.nextn_predict_layers": 1} if next_token else {})
    kwargs = {"n_layers": N_LAYERS + int(next_token), "n_embd": 256, "n_head": 4, "n_head_kv": 2, "n_ff": 512,
              "qtype": QWEN35_VARIANTS[variant], "block_scales": Q4_K_BLOCK_SCALES,
              "std": {"token_embd.weight": EMBED_STD, "ssm_conv1d.weight": 0.3, "ssm_a": 0.2,
                      "ffn_gate_inp.weight": ROUTER_STD},
              "center": {"ssm_a": -0.5}, "family_metadata": family, "tokenizer": True, "tokenizer_pre": "qwen2",
              "seed": seed, "skip_tensors": (f"blk.{N_LAYERS}.nextn.shared_head_norm.weight",)}
    write_tiny_model(path, arch, **(kwargs | overrides))


QWEN35MOE = "qwen35moe"
QWEN35MOE_VARIANTS = {"f32": T.F32, "q4_k": T.Q4_K}  # the experts' format; the rest F32
QWEN35MOE_SEED = 5  # of the first 12, the one whose variants route clear of ties (max |Δ| smallest)


def write_qwen35moe_model(path: Path | str, variant: str = "f32", *, seed: int = QWEN35MOE_SEED,
                          next_token: bool = False, **overrides) -> None:
    """The tiny qwen35moe model of `variant` (a key of QWEN35MOE_VARIANTS); `next_token` and `overrides` as
    write_qwen35_model's."""
    experts = {f"{QWEN35MOE}.{k}": v for k, v in {
        "expert_count": N_EXPERT, "expert_used_count": N_USED, "expert_feed_forward_length": N_FF_EXP,
        "expert_shared_feed_forward_length": N_FF_EXP, **({"nextn_predict_layers": 1} if next_token else {})}.items()}
    kwargs = {"qtype": T.F32, "expert_qtype": QWEN35MOE_VARIANTS[variant],
              "family_metadata": qwen35_metadata(QWEN35MOE) | experts}
    write_qwen35_model(path, seed=seed, arch=QWEN35MOE, next_token=next_token, **(kwargs | overrides))


HYBRID_ORACLE_MODELS = {f"{QWEN35}-{v}": (partial(write_qwen35_model, variant=v), qtype, v)
                        for v, qtype in QWEN35_VARIANTS.items()}
HYBRID_ORACLE_MODELS |= {f"{QWEN35MOE}-{v}": (partial(write_qwen35moe_model, variant=v), qtype, v)
                         for v, qtype in QWEN35MOE_VARIANTS.items()}
# with the next-token-prediction layer: llama.cpp loads it and leaves it out of the forward, as the engine does
HYBRID_ORACLE_MODELS |= {f"{QWEN35}-f32-mtp": (partial(write_qwen35_model, variant="f32", next_token=True), T.F32,
                                               "f32"),
                         f"{QWEN35MOE}-q4_k-mtp": (partial(write_qwen35moe_model, variant="q4_k", next_token=True),
                                                   T.Q4_K, "q4_k")}
