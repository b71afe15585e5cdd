"""Tiny models and documents for the cartridge tests."""

import pytest

from tests.engine.chat.conftest import byte_level_chatml_tokenizer


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Factory: `tiny_models(seed, **shape)` -> a tiny random llama-family model over the byte-level ChatML
    vocabulary (one per distinct argument set) with a 4096-token context, and its tokenizer."""
    from gguf import GGUFValueType

    from engine.models import load_model
    from tests.synthetic import write_tiny_model

    tokenizer = byte_level_chatml_tokenizer()
    made = {}

    def get(seed=0, **shape):
        key = (seed, tuple(sorted(shape.items())))
        if key not in made:
            path = tmp_path_factory.mktemp("cartridge") / f"tiny-{len(made)}.gguf"
            write_tiny_model(path, "llama", vocab=tokenizer.vocab_size, seed=seed,
                             metadata={"llama.context_length": (4096, GGUFValueType.UINT32)}, **shape)
            made[key] = load_model(path)
        return made[key], tokenizer

    return get


@pytest.fixture
def tiny(tiny_models):
    return tiny_models()


@pytest.fixture
def cartridges(tmp_path, monkeypatch):
    """An empty cartridge folder, which is also where the data dir keeps them."""
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path / "home"))
    from engine.cartridge.store import cartridge_dir

    return cartridge_dir()


@pytest.fixture(scope="session")
def tiny_chat_file_model(tmp_path_factory):
    """A tiny random model carrying the byte-level ChatML tokenizer in its GGUF (the session layer reads
    both from the file), with a 4096-token context."""
    from engine.models import load_model
    from tests.engine.chat.conftest import write_tiny_chatml_model

    return load_model(write_tiny_chatml_model(tmp_path_factory.mktemp("cartridge") / "tiny-chatml.gguf", 4096))
