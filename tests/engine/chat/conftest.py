"""Real starter models for the chat tests, each loaded once per session."""

import numpy as np
import pytest

from engine.sampling import LogitProcessor


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

    return load_tokenizer(byte_level_chatml_metadata())


def byte_level_chatml_metadata() -> dict:
    """The GGUF tokenizer metadata of byte_level_chatml_tokenizer."""
    alphabet = [chr(c) for c in range(ord("!"), ord("~") + 1)] + [chr(c) for c in range(0xA1, 0xAD)] + \
        [chr(c) for c in range(0xAE, 0x100)]
    alphabet += [chr(256 + i) for i in range(256 - len(alphabet))]  # GPT-2's stand-ins for the other bytes
    tokens = alphabet + ["hi", "<|im_start|>", "<|im_end|>"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * (len(tokens) - 2) + [3, 3],
        "tokenizer.ggml.merges": ["h i"],
        "tokenizer.ggml.eos_token_id": len(tokens) - 1,
        "tokenizer.ggml.add_bos_token": False,
    }


def write_tiny_chatml_model(path, context_length: int | None = None):
    """A tiny random llama-family GGUF that carries the byte-level ChatML tokenizer (so the session layer,
    which reads both from the file, runs on it); ChatML is the llama family's format."""
    from gguf import GGUFValueType as V

    from tests.synthetic import write_tiny_model

    kinds = {str: V.STRING, bool: V.BOOL, int: V.UINT32, list: V.ARRAY}
    metadata = {k: (v, kinds[type(v)]) for k, v in byte_level_chatml_metadata().items()}
    if context_length is not None:
        metadata["llama.context_length"] = (context_length, V.UINT32)
    write_tiny_model(path, "llama", vocab=len(metadata["tokenizer.ggml.tokens"][0]), metadata=metadata)
    return path


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory):
    """A tiny random model carrying the byte-level ChatML tokenizer in its GGUF."""
    from engine.models import load_model

    return load_model(write_tiny_chatml_model(tmp_path_factory.mktemp("chat") / "tiny-chatml.gguf"))


class Script(LogitProcessor):
    """Forces the given tokens, one per sample, a new list each turn (the conversation resets it per turn);
    past the end of a list the model chooses."""

    def __init__(self, *turns):
        self.turns, self.turn, self.pos, self.commits = [list(t) for t in turns], -1, 0, 0

    def reset(self):
        self.turn, self.pos = self.turn + 1, 0

    def process(self, logits, history):
        script = self.turns[self.turn] if self.turn < len(self.turns) else []
        if self.pos < len(script):
            logits[:] = -np.inf
            logits[script[self.pos]] = 0.0

    def commit(self, token):
        self.pos += 1
        self.commits += 1
