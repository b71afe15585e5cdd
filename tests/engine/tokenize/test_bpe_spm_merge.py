"""The short-word rescan and the long-word heap merge the same pairs."""

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.tokenize import merge as m

alphabet = st.sampled_from("abc")
pairs = st.tuples(st.text(alphabet, min_size=1, max_size=2), st.text(alphabet, min_size=1, max_size=2))


@settings(max_examples=300, deadline=None)
@given(st.lists(pairs, max_size=12, unique=True), st.text(alphabet, max_size=60), st.booleans())
def test_rescan_and_heap_agree(rules, word, by_text):
    if by_text:
        priorities = {a + b: -len(a + b) + i / 100 for i, (a, b) in enumerate(rules)}
    else:
        priorities = {pair: rank for rank, pair in enumerate(rules)}
    expected = m._merge_heap(list(word), priorities, by_text)
    assert m.merge(list(word), priorities, by_text=by_text) == expected
    assert "".join(expected) == word


def test_long_words_take_the_heap():
    word = "a" * 10_000
    merged = m.merge(list(word), {("a", "a"): 0, ("aa", "aa"): 1}, by_text=False)
    assert merged == ["aaaa"] * 2500
