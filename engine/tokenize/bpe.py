"""Byte-level BPE (GPT-2 / Llama 3 / Qwen / SmolLM) and SentencePiece-style BPE (Gemma 4), built from GGUF
metadata alone.

A plain fragment is cut into words by the model's pre-tokenizer; each word's UTF-8 bytes are spelled
in GPT-2's printable byte alphabet and merged by rank (merge.py). Whole words are cached.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from engine.errors import TokenizerError
from engine.gguf.meta import meta_value
from engine.tokenize.base import Tokenizer
from engine.tokenize.merge import SpanTable, encode_words
from engine.tokenize.pretokenize import pretokenizer_for
from engine.tokenize.spm import SPACE
from engine.tokenize.vocab import Vocab, read_vocab


def _byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable character map: printable Latin-1 bytes stand for themselves, the
    rest take the code points from U+0100 up, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(0x100, 0x200))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


BYTE_CHARS = _byte_alphabet()
_TO_ALPHABET = {i: c for i, c in enumerate(BYTE_CHARS)}  # str.translate table over latin-1 text
_FROM_ALPHABET = {c: i for i, c in enumerate(BYTE_CHARS)}

# Llama-3-style vocabularies: BOS by default, and (like GLM-4) a word that is itself a token stays whole
# instead of being merged (their Hugging Face tokenizers set ignore_merges).
_LLAMA3 = {"llama3", "llama-bpe", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}
_GLM = {"glm4", "glm5", "chatglm-bpe"}
_IGNORE_MERGES = _LLAMA3 | {"glm4", "glm5"}


class BPETokenizer(Tokenizer):
    def __init__(self, vocab: Vocab, merges: Sequence[str], pre: str | None = None):
        super().__init__(vocab)
        self.pretokenizer, self.pre_mismatch = pretokenizer_for(pre)
        self._ignore_merges = pre in _IGNORE_MERGES
        texts, splits, ranks = [], [], []
        for rank, rule in enumerate(merges):
            cut = rule.find(" ", 1)  # llama.cpp: the first space after the first character
            if cut > 0:
                texts.append(rule[:cut] + rule[cut + 1:])
                splits.append(cut)
                ranks.append(rank)
        self._merges = SpanTable(texts, splits)
        self._ranks = np.array(ranks, dtype=np.float64)
        self._tokens = SpanTable(vocab.tokens)
        # llama.cpp's fallback for a merge result missing from the vocabulary: each UTF-8 byte of the
        # spelled symbol as a one-byte token, dropped when there is none
        single = [bytes([b]).decode("utf-8", "surrogateescape") for b in range(256)]
        self._byte_ids = np.array([vocab.ids.get(c, -1) for c in single], dtype=np.int64)

    @classmethod
    def from_metadata(cls, metadata: dict) -> BPETokenizer:
        merges = _merges(metadata)
        pre = meta_value(metadata, "tokenizer.ggml.pre", "string", TokenizerError)
        # llama.cpp's BPE defaults when metadata is silent: id 11 for BOS (none for GLM) and EOS
        vocab = read_vocab(metadata, bos=None if pre in _GLM else 11, eos=11, unk=None, add_bos=pre in _LLAMA3)
        return cls(vocab, merges, pre)

    def _split_words(self, text: str, after_special: bool) -> list[str]:
        return self.pretokenizer.split(text)

    def _encode_new_words(self, words: list[str]) -> list[tuple[int, ...]]:
        spelled = [w.encode("utf-8").decode("latin-1").translate(_TO_ALPHABET) for w in words]
        token_ids = self.vocab.ids
        # with ignore_merges a word that is a token stays whole
        todo = [s for s in spelled if not (self._ignore_merges and s in token_ids)]
        merged = dict(zip(todo, encode_words(todo, self._merges, self._ranks, self._tokens, self._byte_ids)))
        return [merged[s] if s in merged else (token_ids[s],) for s in spelled]

    def _normal_bytes(self, text: str) -> bytes:
        # a character outside the byte alphabet (a malformed vocabulary) stands for its own UTF-8
        return b"".join(
            bytes([_FROM_ALPHABET[c]]) if c in _FROM_ALPHABET else c.encode("utf-8", "surrogateescape")
            for c in text
        )


class SpacedBPETokenizer(BPETokenizer):
    """SentencePiece-style BPE (tokenizer.ggml.model "gemma4", Gemma 4's), as llama.cpp runs it: spaces are
    written "▁", the text is cut only at newlines ("[^\\n]+|[\\n]+") and each piece merged by rank over its
    raw UTF-8 characters (no byte alphabet); a run of newlines that is a token stays whole; a symbol outside
    the vocabulary falls back to its <0xXX> byte tokens. BOS is always added (llama.cpp overrides a file's
    add_bos_token false)."""

    def __init__(self, vocab: Vocab, merges: Sequence[str]):
        super().__init__(vocab, merges, "gemma4")
        self._byte_ids = np.array([vocab.ids.get(f"<0x{b:02X}>", -1) for b in range(256)], dtype=np.int64)

    @classmethod
    def from_metadata(cls, metadata: dict) -> SpacedBPETokenizer:
        vocab = read_vocab(metadata, bos=None, eos=None, unk=None, add_bos=True)
        vocab.add_bos = True
        return cls(vocab, _merges(metadata))

    def _split_words(self, text: str, after_special: bool) -> list[str]:
        return self.pretokenizer.split(text.replace(" ", SPACE))

    def _encode_new_words(self, words: list[str]) -> list[tuple[int, ...]]:
        token_ids = self.vocab.ids
        whole = {w: (token_ids[w],) for w in words if w in token_ids and not w.strip("\n")}
        todo = [w for w in words if w not in whole]
        merged = dict(zip(todo, encode_words(todo, self._merges, self._ranks, self._tokens, self._byte_ids)))
        return [whole[w] if w in whole else merged[w] for w in words]

    def _normal_bytes(self, text: str) -> bytes:
        return text.replace(SPACE, " ").encode("utf-8", "surrogateescape")


def _merges(metadata: dict) -> list[str]:
    merges = meta_value(metadata, "tokenizer.ggml.merges", "strings", TokenizerError)
    if not merges:
        raise TokenizerError("BPE model without merges (tokenizer.ggml.merges is missing or empty)")
    return merges
