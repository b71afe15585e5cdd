"""Tokenizers that match llama.cpp token for token, built from GGUF metadata alone.

`load_tokenizer(metadata)` picks the kind from `tokenizer.ggml.model`: "gpt2" is byte-level BPE,
"llama" is SentencePiece, "gemma4" SentencePiece-style BPE. All share one interface (base.Tokenizer);
StreamDecoder turns generated ids into text as soon as it is complete UTF-8.
"""

from __future__ import annotations

from engine.errors import TokenizerError
from engine.gguf.meta import meta_value
from engine.tokenize.base import Tokenizer
from engine.tokenize.bpe import BPETokenizer, SpacedBPETokenizer
from engine.tokenize.spm import SPMTokenizer
from engine.tokenize.stream import StreamDecoder

__all__ = ["BPETokenizer", "SPMTokenizer", "StreamDecoder", "Tokenizer", "load_tokenizer"]

_KINDS = {"gpt2": BPETokenizer, "llama": SPMTokenizer, "gemma4": SpacedBPETokenizer}


def load_tokenizer(metadata: dict) -> Tokenizer:
    """The tokenizer a GGUF's metadata describes (`GGUFFile.metadata`)."""
    model = meta_value(metadata, "tokenizer.ggml.model", "string", TokenizerError)
    if model is None:
        raise TokenizerError("the model has no tokenizer (tokenizer.ggml.model is missing)")
    kind = _KINDS.get(model)
    if kind is None:
        raise TokenizerError(
            f"unsupported tokenizer kind tokenizer.ggml.model = {model!r}; "
            f"supported: {', '.join(repr(k) for k in _KINDS)} (byte-level BPE, SentencePiece, SentencePiece-style BPE)"
        )
    return kind.from_metadata(metadata)
