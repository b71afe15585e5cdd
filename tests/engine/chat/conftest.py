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
    """The tokenizer of tests.synthetic.CHATML_TOKENIZER."""
    from engine.tokenize import load_tokenizer
    from tests.synthetic import CHATML_TOKENIZER

    return load_tokenizer(CHATML_TOKENIZER)


@pytest.fixture(scope="session")
def tiny_chat(tmp_path_factory):
    """(model, tokenizer): a tiny random llama-family model over the byte-level ChatML vocabulary."""
    from engine.models import load_model
    from tests.synthetic import write_tiny_model

    tokenizer = byte_level_chatml_tokenizer()
    path = tmp_path_factory.mktemp("chat") / "tiny.gguf"
    write_tiny_model(path, "llama", vocab=tokenizer.vocab_size)
    return load_model(path), tokenizer
