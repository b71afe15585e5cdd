"""Fixtures shared by the engine's test folders."""

import pytest


@pytest.fixture(scope="session")
def tiny_chat(tmp_path_factory):
    """(model, tokenizer): a tiny random llama-family model over the byte-level ChatML vocabulary."""
    from engine.models import load_model
    from tests.engine.chat.conftest import byte_level_chatml_tokenizer
    from tests.synthetic import write_tiny_model

    tokenizer = byte_level_chatml_tokenizer()
    path = tmp_path_factory.mktemp("chat") / "tiny.gguf"
    write_tiny_model(path, "llama", vocab=tokenizer.vocab_size)
    return load_model(path), tokenizer
