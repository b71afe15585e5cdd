"""Incremental detokenization for streaming generation."""

from __future__ import annotations

import codecs

from engine.tokenize.base import Tokenizer


class StreamDecoder:
    """Turns token ids into text as they arrive, holding back a character split across tokens.

    `push` returns only complete UTF-8 (possibly ""). A stream that ends inside a character (a stop, the
    token budget or the user cut it there) leaves those bytes held back: they are no text, so they are never
    shown nor stored as U+FFFD. `reset` drops them and makes the decoder ready for a new stream.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token: int) -> str:
        return self._utf8.decode(self._tokenizer.token_bytes(token))

    def reset(self) -> None:
        self._utf8.reset()
