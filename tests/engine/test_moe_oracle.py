"""qwen3moe, gpt-oss, deepseek2, glm4moe and qwen35 against llama.cpp: the tiny random models of
tests/moe_models.py and tests/hybrid_models.py,
teacher-forced through the prefill path (also with its GEMMs forced on) and the row-wise path (what `fucina eval
--path prefill|rows` runs), give
llama.cpp's logits (tests/data/moe, recorded by record_llama_logits.py there) within the bars of DESIGN.md: the same
top-1 wherever llama.cpp's top-1 beats its top-2 by more than 0.1, and mean |logit difference| at most 0.01 on the
F32 models and 0.1 on the ones with quantized experts. The model whose routers tie every expert checks the tie
order."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from engine import generate
from engine.models import load_model
from kernels.cpu import lane_gemm, quant
from tests.gemma4_models import GEMMA4_ORACLE_MODELS
from tests.hybrid_models import HYBRID_ORACLE_MODELS
from tests.moe_models import ORACLE_MODELS

ORACLE_MODELS = ORACLE_MODELS | HYBRID_ORACLE_MODELS | GEMMA4_ORACLE_MODELS

DATA = Path(__file__).resolve().parents[1] / "data" / "moe"
CLEAR_MARGIN = 0.1


@pytest.fixture(scope="module", params=list(ORACLE_MODELS))
def case(request, tmp_path_factory):
    """(the experts' format, model, llama.cpp's record) for a model written as the record's was."""
    name = request.param
    write, expert_qtype, _ = ORACLE_MODELS[name]
    record = json.loads((DATA / f"{name}.json").read_text())
    path = tmp_path_factory.mktemp("moe-oracle") / f"{name}.gguf"
    write(path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == record["gguf_sha256"], (
        "the tests write another model than llama.cpp's logits were recorded on: re-run "
        "tests/data/moe/record_llama_logits.py")
    return expert_qtype, load_model(path), record


@pytest.mark.parametrize("path", ["prefill", "rows", "gemm"])
def test_logits_match_llama_cpp(case, path, monkeypatch):
    """`gemm`: the prefill path with its GEMMs taking every product and expert they can (the records' 32
    positions are below the row counts where they start otherwise)."""
    expert_qtype, model, record = case
    expected = np.asarray(record["logits"], dtype=np.float32)
    if path == "gemm":
        monkeypatch.setattr(quant, "_MATVEC_MAX_ROWS", 0)
        monkeypatch.setattr(lane_gemm, "MIN_INPUT_ROWS", 1)
    logits = np.concatenate(list(generate.teacher_forced(model, record["ids"],
                                                         path="prefill" if path == "gemm" else path)))
    assert logits.shape == expected.shape
    top2 = np.sort(expected, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > CLEAR_MARGIN
    parted = np.nonzero(clear & (logits.argmax(axis=1) != expected.argmax(axis=1)))[0]
    assert parted.size == 0, f"top-1 differs from llama.cpp's at positions {parted.tolist()}"
    diff = np.abs(logits - expected)
    bar = 0.01 if expert_qtype == T.F32 else 0.1
    assert diff.mean() <= bar, f"mean |logit difference| {diff.mean():.4f} (max {diff.max():.3f})"
