"""The compiled merge loop against a plain statement of llama.cpp's rule."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.tokenize.merge import SpanTable, encode_words

ALPHABET = "ab€\U0001F600"
NO_BYTES = np.full(256, -1, dtype=np.int64)


def reference(word: str, priority) -> list[str]:
    """Merge the adjacent pair with the lowest priority, the leftmost on ties, until none merges."""
    symbols = list(word)
    while len(symbols) > 1:
        ranked = [priority(a, b) for a, b in zip(symbols, symbols[1:])]
        best = min(ranked)
        if best == math.inf:
            break
        i = ranked.index(best)
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
    return symbols


pieces = st.text(st.sampled_from(ALPHABET), min_size=1, max_size=3)
words = st.lists(st.one_of(st.text(st.sampled_from(ALPHABET), max_size=40),
                           st.text(st.sampled_from("ab"), min_size=60, max_size=150)), max_size=4)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(pieces, pieces), max_size=12), words)
def test_bpe_rules_merge_as_llama_cpp(rules, words):
    ranks = {}
    for rank, pair in enumerate(rules):
        ranks.setdefault(pair, rank)  # a repeated rule keeps its first rank
    vocab = sorted(set(ALPHABET) | {a + b for a, b in rules})
    merges = SpanTable([a + b for a, b in rules], [len(a) for a, _ in rules])
    got = encode_words(words, merges, np.arange(len(rules), dtype=np.float64), SpanTable(vocab), NO_BYTES)
    expected = [tuple(vocab.index(s) for s in reference(w, lambda a, b: ranks.get((a, b), math.inf)))
                for w in words]
    assert got == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(pieces, st.integers(-5, 5)), max_size=12), words)
def test_spm_scores_merge_as_llama_cpp(tokens, words):
    vocab = list(ALPHABET) + [t for t, _ in tokens]
    scores = {}
    for text, score in zip(vocab, [0] * len(ALPHABET) + [s for _, s in tokens]):
        scores.setdefault(text, score)  # a repeated token keeps its first (lowest-id) score
    table = SpanTable(vocab)
    priorities = -np.array([scores[t] for t in vocab], dtype=np.float64)
    got = encode_words(words, table, priorities, table, NO_BYTES)
    expected = [tuple(vocab.index(s) for s in reference(w, lambda a, b: -scores.get(a + b, -math.inf)))
                for w in words]
    assert got == expected


def test_unknown_symbols_fall_back_to_byte_tokens():
    byte_ids = NO_BYTES.copy()
    byte_ids[[0xE2, 0x82, 0xAC]] = [7, 8, 9]  # "€" is E2 82 AC
    table = SpanTable(["a"])
    assert encode_words(["a€a"], table, np.zeros(1), table, byte_ids) == [(0, 7, 8, 9, 0)]


def test_long_words_merge_in_n_log_n():
    merges = SpanTable(["aa", "aaaa"], [1, 2])
    vocab = SpanTable(["a", "aa", "aaaa"])
    got = encode_words(["a" * 200_000, "aaaaa"], merges, np.array([0.0, 1.0]), vocab, NO_BYTES)
    assert got == [(2,) * 50_000, (2, 0)]
