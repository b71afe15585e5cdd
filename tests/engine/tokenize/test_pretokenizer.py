"""Pre-tokenizer rule sets (llama.cpp's regexes on folded text)."""

import pytest

from engine.tokenize.pretokenize import RULES, PreTokenizer, _translate, pretokenizer_for


def split(pre: str, text: str) -> list[str]:
    return PreTokenizer(pre).split(text)


def test_digit_rules_differ_per_family():
    assert split("qwen2", "x 12345") == ["x", " ", "1", "2", "3", "4", "5"]
    assert split("llama-bpe", "x 12345") == ["x", " ", "123", "45"]
    assert split("smollm", "x 12345") == ["x", " ", "1", "2", "3", "4", "5"]
    assert split("default", "x 12345") == ["x", " ", "123", "45"]


def test_whitespace_before_a_word_leaves_one_space_for_it():
    assert split("qwen2", "a   b\n\n  c  ") == ["a", "  ", " b", "\n\n", " ", " c", "  "]
    assert split("gpt2", "a\tb") == ["a", "\t", "b"]  # an unmatched gap is a piece of its own


def test_combining_marks_are_not_letters_except_for_qwen35():
    assert split("qwen2", "a\u0301b") == ["a", "\u0301b"]  # the mark prefixes the next word
    assert split("qwen35", "a\u0301b") == ["a\u0301b"]


def test_non_ascii_whitespace_and_contractions():
    assert split("llama3", "we'LL\u00a0go") == ["we", "'LL", "\u00a0go"]
    assert split("gpt2", "we'LL go") == ["we", "'", "LL", " go"]  # GPT-2's contractions are lowercase


def test_every_rule_set_compiles_and_pieces_tile_the_text():
    text = "Hi  there!\n\n\tx=12345; naïve — 中文，テスト 한국어 😀 it's\u3000ok $5 ~~~"
    for pre in RULES:
        pieces = split(pre, text)
        assert "".join(pieces) == text and all(pieces), pre


def test_class_escapes_are_folded_inside_and_outside_brackets():
    assert _translate(r"\p{N}") == "[\xd10123456789]"
    assert _translate(r"[^\s\p{M}]") == "[^\\s\xd4]"
    assert _translate(r"\s+$") == r"\s+\Z"


@pytest.mark.parametrize("pre", ["", None])
def test_missing_pre_means_default(pre):
    tokenizer, mismatch = pretokenizer_for(pre)
    assert tokenizer.name == "default" and mismatch is None
