"""A loaded model's tokenizer, built once and shared by everything that serves the model: its chat sessions,
its engine service and the documents read for it. Building one takes a second or more (Qwen's 151k-token
vocabulary), and a model's tokenizer never changes."""

from __future__ import annotations

import weakref

from engine.models.model import Model
from engine.tokenize import Tokenizer, load_tokenizer

_TOKENIZERS: "weakref.WeakKeyDictionary[Model, Tokenizer]" = weakref.WeakKeyDictionary()


def tokenizer_for(model: Model) -> Tokenizer:
    if model not in _TOKENIZERS:
        _TOKENIZERS[model] = load_tokenizer(model.file.metadata)
    return _TOKENIZERS[model]
