import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import SamIndexError
from engine.speculative.sam_index import Cursor, FrozenSource, SamIndex


def brute_match(stream: list[int]) -> tuple[int, int]:
    """(length, end) of the longest suffix of stream that also ends at an earlier position, and the most
    recent such end; (0, -1) when none."""
    i = len(stream) - 1
    best, end = 0, -1
    for e in range(i):
        n = 0
        while n <= e and stream[e - n] == stream[i - n]:
            n += 1
        if n and n >= best:
            best, end = n, e
    return best, end


def brute_doc_match(doc: list[int], stream: list[int]) -> tuple[int, int]:
    """(length, end) of the longest suffix of stream that occurs in doc, and its last end in doc."""
    best, end = 0, -1
    for e in range(len(doc)):
        n = 0
        while n <= e and n < len(stream) and doc[e - n] == stream[len(stream) - 1 - n]:
            n += 1
        if n and n >= best:
            best, end = n, e
    return best, end


def test_spec_example_longest_self_excluded_suffix_drives_the_draft():
    sam = SamIndex()
    sam.append([5, 6, 7, 5, 6])
    assert sam.match_len() == 2  # [5, 6] occurred ending strictly before the end
    assert sam.draft(8) == [7, 5, 6]  # what followed that occurrence


def test_draft_follows_the_most_recent_prior_occurrence():
    sam = SamIndex()
    sam.append([1, 2, 3, 1, 2, 4, 9, 1, 2])
    assert sam.match_len() == 2
    assert sam.draft(2) == [4, 9]  # the [1, 2] at 3..4, not the first one at 0..1


def test_budget_max_draft_and_min_match_bound_the_draft():
    sam = SamIndex(min_match=3, max_draft=2)
    sam.append([1, 2, 3, 4, 1, 2])
    assert sam.match_len() == 2 and sam.draft() == []  # below min_match
    sam.append([3])
    assert sam.draft() == [4, 1]  # max_draft
    assert sam.draft(1) == [4]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4).flatmap(lambda a: st.lists(st.integers(0, a - 1), min_size=1, max_size=80)))
def test_matches_brute_force_at_every_step(stream):
    sam = SamIndex(min_match=1, max_draft=5)
    for i, token in enumerate(stream):
        sam.append([token])
        seen = stream[: i + 1]
        length, end = brute_match(seen)
        assert sam.match_len() == length
        assert sam.match_end() == end
        assert sam.draft() == (seen[end + 1: end + 6] if length else [])


def test_repeated_token_stream_stays_exact():
    sam = SamIndex(min_match=1)
    for n in range(1, 300):
        sam.append([7])
        assert sam.match_len() == n - 1
        assert sam.match_end() == (n - 2 if n > 1 else -1)


def test_failed_append_poisons_the_index():
    sam = SamIndex(min_match=1)
    sam.append([1, 2, 1, 2])
    assert sam.match_len() == 2
    with pytest.raises(SamIndexError, match="poisoned"):
        sam.append([1, -5, 2])  # fails half-way: token 1 went in, -5 did not
    assert sam.poisoned
    assert sam.match_len() == 0 and sam.draft() == [] and sam.token_count() == 0
    with pytest.raises(SamIndexError, match="poisoned"):
        sam.append([1])
    sam.observe([1, 2])  # the DraftSource path swallows the error: still no drafts, no exception
    assert sam.suggest([1, 2], 8) == []


def test_frozen_index_refuses_appends_without_poisoning():
    sam = SamIndex()
    sam.append([1, 2, 3])
    sam.freeze()
    with pytest.raises(SamIndexError, match="frozen"):
        sam.append([4])
    assert not sam.poisoned and sam.token_count() == 3


def test_cursors_need_a_frozen_index():
    sam = SamIndex()
    sam.append([1, 2, 3])
    with pytest.raises(SamIndexError, match="freeze"):
        sam.advance(Cursor(), 1)
    with pytest.raises(SamIndexError, match="frozen"):
        FrozenSource(sam)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 3).flatmap(lambda a: st.tuples(st.lists(st.integers(0, a - 1), min_size=1, max_size=40),
                                                     st.lists(st.integers(0, a), min_size=1, max_size=40))))
def test_external_cursor_matches_brute_force(doc_and_stream):
    doc, stream = doc_and_stream
    index = SamIndex(min_match=1, max_draft=4)
    index.append(doc)
    index.freeze()
    source = FrozenSource(index)
    for i, token in enumerate(stream):
        source.observe([token])
        length, end = brute_doc_match(doc, stream[: i + 1])
        assert source.match_len() == length
        assert source.suggest(stream[: i + 1], 4) == (doc[end + 1: end + 5] if length else [])


def test_two_cursors_over_one_frozen_document_are_independent():
    index = SamIndex()
    index.append([10, 11, 12, 13, 14])
    index.freeze()
    a, b = FrozenSource(index, [11, 12]), FrozenSource(index, [13])
    assert a.suggest([], 8) == [13, 14]
    assert b.suggest([], 8) == []  # a 1-token match is below min_match
    b.observe([14])
    assert b.match_len() == 2 and b.suggest([], 8) == []  # matched the document's end: nothing follows
