"""llama.cpp's reference data for the starter models (tests/data/golden, a read-only copy of llama.cpp output)."""

import json
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"

# starter model -> stem of its golden files
GOLDEN_STEM = {
    "smollm2-135m-instruct": "smollm2-135m-instruct-q4_1",
    "qwen2.5-coder-0.5b-instruct": "qwen2.5-coder-0.5b-instruct",
    "gemma-3-270m": "gemma-3-270m-q4_k_m",
}
MODELS = list(GOLDEN_STEM)


def golden(model: str, suffix: str = "") -> dict:
    return json.loads((GOLDEN / f"{GOLDEN_STEM[model]}{suffix}.json").read_text())
