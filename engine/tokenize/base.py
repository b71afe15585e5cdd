"""What every tokenizer offers, and the parts both kinds share: special-token partition, the BOS/EOS
policy, a per-word cache, and decoding through per-token bytes."""

from __future__ import annotations

import re
import threading
from abc import ABC, abstractmethod
from itertools import chain
from typing import Iterable

from engine.errors import TokenizerError
from engine.tokenize.special import SpecialMatcher
from engine.tokenize.vocab import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED, Vocab

# Words cached per tokenizer before the cache is dropped and refilled (bounds memory on huge inputs).
_CACHE_LIMIT = 1 << 17
_SURROGATE = re.compile("[\ud800-\udfff]")


class Tokenizer(ABC):
    """Text <-> token ids, token-ID-exact with llama.cpp for the same GGUF metadata."""

    # SentencePiece models that prepend a space to the text drop it again when decoding.
    _strips_space_prefix = False

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self._matchers: dict[bool, SpecialMatcher] = {True: SpecialMatcher(vocab.specials(parse_special=True))}
        self._words: dict[str, tuple[int, ...]] = {}
        self._words_lock = threading.Lock()  # the GUI and the generation worker may encode at once
        self._pieces: dict[int, bytes] = {}

    # -- identity -------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def bos_id(self) -> int | None:
        return self.vocab.bos_id

    @property
    def eos_id(self) -> int | None:
        return self.vocab.eos_id

    @property
    def add_bos(self) -> bool:
        return self.vocab.add_bos

    @property
    def eog_ids(self) -> frozenset[int]:
        """End of generation: eos, and template end markers such as <|im_end|> or <end_of_turn>."""
        return self.vocab.eog_ids

    def token_id(self, piece: str) -> int | None:
        """The id of a token given its vocabulary text (e.g. "<|im_end|>"), or None."""
        return self.vocab.ids.get(piece)

    # -- encoding -------------------------------------------------------------------------------------
    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids for `text`, as llama.cpp's llama_tokenize gives them.

        `add_special` applies the model's BOS/EOS policy. `parse_special` matches control tokens
        written in the text (e.g. "<|im_end|>") as single ids; without it only user-defined tokens are.
        Lone surrogates, which UTF-8 cannot carry, are encoded as U+FFFD.
        """
        text = _utf8_safe(text)
        segments: list[int | list[str]] = []  # special-token ids and the words of plain fragments
        after_special = True
        for fragment in self._matcher(parse_special).partition(text):
            if isinstance(fragment, int):
                segments.append(fragment)
                after_special = True
            else:
                segments.append(self._split_words(fragment, after_special))
                after_special = False
        ids = self._ids(segments)
        if add_special and self.vocab.add_bos:
            ids.insert(0, _required(self.vocab.bos_id, "BOS"))
        if add_special and self.vocab.add_eos:
            ids.append(_required(self.vocab.eos_id, "EOS"))
        return ids

    def encode_plain(self, text: str) -> list[int]:
        """Token ids for `text` with no special-token matching and no BOS/EOS: for callers that insert
        control tokens themselves and must never have them injected by user text."""
        return self._ids([self._split_words(_utf8_safe(text), True)]) if text else []

    def _ids(self, segments: list[int | list[str]]) -> list[int]:
        """Ids of special tokens and words in order; words not cached yet are encoded in one batch."""
        cache = self._words
        words = [seg for seg in segments if not isinstance(seg, int)]
        ids: list[int] = []
        with self._words_lock:
            missing = set().union(*words).difference(cache)
            if missing:
                if len(cache) + len(missing) > _CACHE_LIMIT:  # start over rather than grow without bound
                    cache.clear()
                    missing = set().union(*words)
                missing = list(missing)
                cache.update(zip(missing, self._encode_new_words(missing)))
            for seg in segments:
                if isinstance(seg, int):
                    ids.append(seg)
                else:
                    ids.extend(chain.from_iterable(map(cache.__getitem__, seg)))
        return ids

    def clear_cache(self) -> None:
        """Forget the cached word encodings (they are rebuilt on demand)."""
        with self._words_lock:
            self._words.clear()

    def _matcher(self, parse_special: bool) -> SpecialMatcher:
        if parse_special not in self._matchers:
            self._matchers[parse_special] = SpecialMatcher(self.vocab.specials(parse_special=parse_special))
        return self._matchers[parse_special]

    @abstractmethod
    def _split_words(self, text: str, after_special: bool) -> list[str]:
        """One plain fragment cut into independently encodable words (the unit of caching);
        `after_special` is true at the start of the text and after a special token."""

    @abstractmethod
    def _encode_new_words(self, words: list[str]) -> list[tuple[int, ...]]:
        """The ids of each word."""

    # -- decoding -------------------------------------------------------------------------------------
    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for. Control tokens render as their text (e.g. b"<|im_end|>");
        unused/undefined ones as nothing, as in llama.cpp."""
        piece = self._pieces.get(token)
        if piece is None:
            if not 0 <= token < len(self.vocab):
                raise IndexError(f"token id {token} is outside the vocabulary (size {len(self.vocab)})")
            kind = self.vocab.types[token]
            text = self.vocab.tokens[token]
            if kind == NORMAL:
                piece = self._normal_bytes(text)
            elif kind in (CONTROL, USER_DEFINED, UNKNOWN):
                piece = text.encode("utf-8", "surrogateescape")
            elif kind == BYTE:
                piece = bytes([int(text[3:5], 16)])
            else:
                piece = b""
            self._pieces[token] = piece
        return piece

    def decode_bytes(self, ids: Iterable[int], *, skip_special: bool = False) -> bytes:
        """The bytes of a token sequence; `skip_special` leaves out control and unknown tokens."""
        ids = list(ids)
        pieces = [self.token_bytes(i) for i in ids]
        if self._strips_space_prefix:  # from the first token after an optional BOS
            k = 1 if ids[:1] == [self.vocab.bos_id] else 0
            if k < len(pieces) and pieces[k].startswith(b" "):
                pieces[k] = pieces[k][1:]
        if skip_special:
            pieces = [p for p, i in zip(pieces, ids) if self.vocab.types[i] not in (CONTROL, UNKNOWN)]
        return b"".join(pieces)

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """The text of a token sequence (invalid UTF-8, e.g. a cut-off character, becomes U+FFFD)."""
        return self.decode_bytes(ids, skip_special=skip_special).decode("utf-8", "replace")

    @abstractmethod
    def _normal_bytes(self, text: str) -> bytes:
        """The bytes a NORMAL token's vocabulary text stands for."""


def _utf8_safe(text: str) -> str:
    return _SURROGATE.sub("\ufffd", text) if not text.isascii() else text


def _required(token: int | None, name: str) -> int:
    if token is None:
        raise TokenizerError(f"the model asks for a {name} token but its metadata names none")
    return token
