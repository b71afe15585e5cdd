"""Special-token partition: the one-pass trie scan must pick what llama.cpp's longest-first loop picks."""

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.tokenize.special import SpecialMatcher, _can_overlap


def literal(matcher: SpecialMatcher, text: str):
    return matcher._partition_by_length(text)


def test_longest_marker_wins_and_text_between_is_kept():
    m = SpecialMatcher({"<a>": 0, "<a><b>": 1, "\n": 2, "\n\n": 3})
    assert m.partition("x<a><b>y<a>\n\n\nz") == ["x", 1, "y", 0, 3, 2, "z"]
    assert m.partition("") == []
    assert SpecialMatcher({}).partition("abc") == ["abc"]


def test_overlapping_specials_take_llama_cpps_length_order():
    # "bcd" is longer, so llama.cpp claims it first even though "ab" starts earlier
    specials = {"ab": 0, "bcd": 1}
    assert _can_overlap(list(specials))
    m = SpecialMatcher(specials)
    assert m._regex is None
    assert m.partition("abcd") == ["a", 1]


def test_runs_of_one_character_do_not_count_as_overlap():
    assert not _can_overlap(["\n", "\n\n", "\n\n\n", "  ", "   ", "<unused1>", "<unused12>"])
    assert _can_overlap(["aba"])  # "aba" overlaps itself in "ababa"


runs = st.sampled_from(["\n", "\n\n", "\n\n\n", "  ", "    ", "\t\t"])
markers = st.sampled_from(["<s>", "<|im_end|>", "<x>", "[m]"])
text = st.text(st.sampled_from(list("ab<>|[]sx \n\t")), max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.sets(st.one_of(runs, markers), min_size=1), text)
def test_trie_scan_equals_llama_cpp_order(specials, text):
    m = SpecialMatcher({t: i for i, t in enumerate(sorted(specials))})
    assert m._regex is not None
    assert m.partition(text) == literal(m, text)
