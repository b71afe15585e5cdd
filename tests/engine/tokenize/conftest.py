"""Real starter-model tokenizers (through the catalog's `model_path` fixture) and llama.cpp's golden ids."""

import json
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parents[4] / "shared" / "golden"

# starter model -> stem of its golden files
GOLDEN_STEM = {
    "smollm2-135m-instruct": "smollm2-135m-instruct-q4_1",
    "qwen2.5-coder-0.5b-instruct": "qwen2.5-coder-0.5b-instruct",
    "gemma-3-270m": "gemma-3-270m-q4_k_m",
}
MODELS = list(GOLDEN_STEM)


def golden(model: str, suffix: str = "") -> dict:
    return json.loads((GOLDEN / f"{GOLDEN_STEM[model]}{suffix}.json").read_text())


@pytest.fixture(scope="session")
def real_tokenizer(model_path):
    """Factory: `real_tokenizer(name)` -> the starter model's tokenizer, built once per session."""
    from engine.gguf.reader import open_gguf
    from engine.tokenize import load_tokenizer

    built = {}

    def get(name: str):
        if name not in built:
            built[name] = load_tokenizer(open_gguf(model_path(name)).metadata)
        return built[name]

    return get
