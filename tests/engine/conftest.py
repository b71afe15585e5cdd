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


@pytest.fixture(scope="module")
def smollm2(model_path):
    """The SmolLM2-135M starter's model (a module may define its own `smollm2`)."""
    from engine.models import load_model
    return load_model(model_path("smollm2-135m-instruct"))


@pytest.fixture
def home(tmp_path):
    """(a history store, a sidecar folder) in a fresh folder: a chat session's home."""
    from engine.history.store import HistoryStore

    store = HistoryStore(tmp_path / "history.db")
    yield store, tmp_path / "sidecars"
    store.close()
