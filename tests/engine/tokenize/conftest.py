"""Real starter-model tokenizers (through the catalog's `model_path` fixture) and llama.cpp's golden ids."""

import pytest


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
