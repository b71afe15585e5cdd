"""SentencePiece as llama.cpp runs it (llm_tokenizer_spm): score-driven merges with byte fallback.

Spaces become "▁"; the characters of a fragment merge pairwise, highest-scoring resulting token first;
a symbol left outside the vocabulary falls back to its <0xXX> byte tokens. A merge can only cross the
boundary before a "▁" if some token has a "▁" right after that same character, so fragments are cut
before every other "▁" into words that merge independently - and are cached - with identical results.
"""

from __future__ import annotations

import re

import numpy as np

from engine.errors import TokenizerError
from engine.gguf.meta import meta_value
from engine.tokenize.base import Tokenizer
from engine.tokenize.merge import SpanTable, encode_words
from engine.tokenize.vocab import Vocab, read_vocab

SPACE = "\u2581"  # "▁"


class SPMTokenizer(Tokenizer):
    def __init__(self, vocab: Vocab, scores, *, add_space_prefix: bool = True):
        super().__init__(vocab)
        scores = np.asarray(scores, dtype=np.float32)
        if len(scores) < len(vocab):
            raise TokenizerError(f"tokenizer.ggml.scores has {len(scores)} entries for {len(vocab)} tokens")
        # a pair merges when it spells a token; the highest score goes first
        self._tokens = SpanTable(vocab.tokens)
        self._priorities = -scores[: len(vocab)].astype(np.float64)
        self._add_space_prefix = add_space_prefix
        self._strips_space_prefix = add_space_prefix
        self._byte_ids = np.array([self._byte_token(b) for b in range(256)], dtype=np.int64)
        self._word_starts = _word_boundary(vocab.tokens)

    @classmethod
    def from_metadata(cls, metadata: dict) -> SPMTokenizer:
        scores = meta_value(metadata, "tokenizer.ggml.scores", "numbers", TokenizerError)
        if scores is None:
            raise TokenizerError("SentencePiece model without tokenizer.ggml.scores")
        # llama.cpp's SentencePiece defaults when metadata is silent
        vocab = read_vocab(metadata, bos=1, eos=2, unk=0, add_bos=True)
        space_prefix = meta_value(metadata, "tokenizer.ggml.add_space_prefix", "bool", TokenizerError)
        return cls(vocab, scores, add_space_prefix=True if space_prefix is None else space_prefix)

    def _byte_token(self, byte: int) -> int:
        """llama.cpp's byte fallback: <0xXX>, else the byte as a one-character token (else unknown)."""
        ids = self.vocab.ids
        for text in (f"<0x{byte:02X}>", bytes([byte]).decode("utf-8", "surrogateescape")):
            if text in ids:
                return ids[text]
        return -1 if self.vocab.unk_id is None else self.vocab.unk_id

    def _split_words(self, text: str, after_special: bool) -> list[str]:
        if self._add_space_prefix and after_special:
            text = " " + text
        return [w for w in self._word_starts.split(text.replace(" ", SPACE)) if w]

    def _encode_new_words(self, words: list[str]) -> list[tuple[int, ...]]:
        return encode_words(words, self._tokens, self._priorities, self._tokens, self._byte_ids)

    def _normal_bytes(self, text: str) -> bytes:
        return text.replace(SPACE, " ").encode("utf-8", "surrogateescape")


def _word_boundary(tokens: list[str]) -> re.Pattern:
    """A zero-width regex for the places before a "▁" that no token spans: those whose preceding
    character never comes right before a "▁" inside a token."""
    before = {t[i - 1] for t in tokens if SPACE in t[1:] for i in range(1, len(t)) if t[i] == SPACE}
    if not before:
        return re.compile(f"(?={SPACE})")
    return re.compile(f"(?<![{''.join(re.escape(c) for c in sorted(before))}])(?={SPACE})")
