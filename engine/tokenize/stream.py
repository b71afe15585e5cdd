"""Incremental detokenization for streaming generation."""

from __future__ import annotations

import codecs

from engine.tokenize.base import Tokenizer


class StreamDecoder:
    """Turns token ids into text as they arrive, holding back a character split across tokens.

    `push` returns only complete UTF-8 (possibly ""); `flush` returns what is left when generation ends
    (an unfinished character becomes U+FFFD) and makes the decoder ready for a new stream.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token: int) -> str:
        return self._utf8.decode(self._tokenizer.token_bytes(token))

    def flush(self) -> str:
        tail = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return tail

    def reset(self) -> None:
        self._utf8.reset()
