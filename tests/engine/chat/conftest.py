"""Real starter models for the chat tests, each loaded once per session."""

import pytest


@pytest.fixture(scope="session")
def real_model(model_path):
    """Factory: `real_model(name)` -> (Transformer, tokenizer) of a starter model."""
    from engine.models import load_model
    from engine.tokenize import load_tokenizer

    loaded = {}

    def get(name: str):
        if name not in loaded:
            model = load_model(model_path(name))
            loaded[name] = model, load_tokenizer(model.file.metadata)
        return loaded[name]

    return get


def byte_level_chatml_tokenizer():
    """A byte-level BPE tokenizer with one token per byte, the two ChatML markers and one merge:
    the real tokenizer code over a vocabulary small enough for tiny random models."""
    from engine.tokenize import load_tokenizer

    alphabet = [chr(c) for c in range(ord("!"), ord("~") + 1)] + [chr(c) for c in range(0xA1, 0xAD)] + \
        [chr(c) for c in range(0xAE, 0x100)]
    alphabet += [chr(256 + i) for i in range(256 - len(alphabet))]  # GPT-2's stand-ins for the other bytes
    tokens = alphabet + ["hi", "<|im_start|>", "<|im_end|>"]
    return load_tokenizer({
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * (len(tokens) - 2) + [3, 3],
        "tokenizer.ggml.merges": ["h i"],
        "tokenizer.ggml.eos_token_id": len(tokens) - 1,
        "tokenizer.ggml.add_bos_token": False,
    })


@pytest.fixture(scope="session")
def tiny_chat(tmp_path_factory):
    """(model, tokenizer): a tiny random llama-family model over the byte-level ChatML vocabulary."""
    from engine.models import load_model
    from tests.synthetic import write_tiny_model

    tokenizer = byte_level_chatml_tokenizer()
    path = tmp_path_factory.mktemp("chat") / "tiny.gguf"
    write_tiny_model(path, "llama", vocab=tokenizer.vocab_size)
    return load_model(path), tokenizer
