"""load_tokenizer: kinds and the errors a user can act on."""

import pytest

from engine.errors import FucinaError, TokenizerError
from engine.tokenize import BPETokenizer, SPMTokenizer, load_tokenizer

BPE = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.merges": ["a b"]}
SPM = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "a"], "tokenizer.ggml.scores": [0.0, -1.0]}


def test_kind_follows_tokenizer_model():
    assert isinstance(load_tokenizer(BPE), BPETokenizer)
    assert isinstance(load_tokenizer(SPM), SPMTokenizer)
    assert issubclass(TokenizerError, FucinaError)


@pytest.mark.parametrize("metadata, message", [
    ({}, "tokenizer.ggml.model is missing"),
    ({**BPE, "tokenizer.ggml.model": "bert"}, "unsupported tokenizer kind"),
    ({**BPE, "tokenizer.ggml.tokens": []}, "tokenizer.ggml.tokens"),
    ({**BPE, "tokenizer.ggml.merges": []}, "tokenizer.ggml.merges"),
    ({k: v for k, v in SPM.items() if k != "tokenizer.ggml.scores"}, "tokenizer.ggml.scores"),
    ({**SPM, "tokenizer.ggml.scores": [0.0]}, "tokenizer.ggml.scores has 1 entries"),
    ({**SPM, "tokenizer.ggml.token_type": [1]}, "token_type has 1 entries"),
])
def test_bad_metadata_raises_tokenizer_error(metadata, message):
    with pytest.raises(TokenizerError, match=message):
        load_tokenizer(metadata)


def test_lone_surrogates_become_replacement_characters():
    tok = load_tokenizer({**SPM, "tokenizer.ggml.tokens": ["<unk>", "<0xEF>", "<0xBF>", "<0xBD>"],
                          "tokenizer.ggml.scores": [0.0] * 4, "tokenizer.ggml.add_bos_token": False,
                          "tokenizer.ggml.add_space_prefix": False})
    assert tok.encode("\ud800") == [1, 2, 3]
