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
from engine.tokenize.base import Tokenizer
from engine.tokenize.merge import merge
from engine.tokenize.vocab import Vocab, read_vocab

SPACE = "\u2581"  # "▁"


class SPMTokenizer(Tokenizer):
    def __init__(self, vocab: Vocab, scores, *, add_space_prefix: bool = True):
        super().__init__(vocab)
        scores = np.asarray(scores, dtype=np.float32)
        if len(scores) < len(vocab):
            raise TokenizerError(f"tokenizer.ggml.scores has {len(scores)} entries for {len(vocab)} tokens")
        # merged text -> priority (highest score merges first); reversed so duplicates keep the lowest id
        negated = (-scores[: len(vocab)].astype(np.float64)).tolist()
        self._priority = dict(zip(reversed(vocab.tokens), reversed(negated)))
        self._add_space_prefix = add_space_prefix
        self._strips_space_prefix = add_space_prefix
        self._byte_ids = [self._byte_token(b) for b in range(256)]
        self._word_starts = _word_boundary(vocab.tokens)

    @classmethod
    def from_metadata(cls, metadata: dict) -> SPMTokenizer:
        scores = metadata.get("tokenizer.ggml.scores")
        if scores is None:
            raise TokenizerError("SentencePiece model without tokenizer.ggml.scores")
        # llama.cpp's SentencePiece defaults when metadata is silent
        vocab = read_vocab(metadata, bos=1, eos=2, unk=0, add_bos=True)
        return cls(vocab, scores, add_space_prefix=bool(metadata.get("tokenizer.ggml.add_space_prefix", True)))

    def _byte_token(self, byte: int) -> int | None:
        ids = self.vocab.ids
        for text in (f"<0x{byte:02X}>", bytes([byte]).decode("utf-8", "surrogateescape")):
            if text in ids:
                return ids[text]
        return self.vocab.unk_id

    def _encode_text(self, text: str, after_special: bool) -> list[int]:
        if self._add_space_prefix and after_special:
            text = " " + text
        return self._encode_words(filter(None, self._word_starts.split(text.replace(" ", SPACE))))

    def _encode_word(self, word: str) -> tuple[int, ...]:
        token_ids = self.vocab.ids
        ids = []
        for symbol in merge(list(word), self._priority, by_text=True):
            token = token_ids.get(symbol)
            if token is not None:
                ids.append(token)
            else:
                ids.extend(self._byte_ids[b] for b in symbol.encode("utf-8") if self._byte_ids[b] is not None)
        return tuple(ids)

    def _normal_bytes(self, text: str) -> bytes:
        return text.replace(SPACE, " ").encode("utf-8", "surrogateescape")


def _word_boundary(tokens: list[str]) -> re.Pattern:
    """A zero-width regex for the places before a "▁" that no token spans: those whose preceding
    character never comes right before a "▁" inside a token."""
    before = {t[i - 1] for t in tokens if SPACE in t[1:] for i in range(1, len(t)) if t[i] == SPACE}
    if not before:
        return re.compile(f"(?={SPACE})")
    return re.compile(f"(?<![{''.join(re.escape(c) for c in sorted(before))}])(?={SPACE})")
