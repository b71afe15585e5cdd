"""The generated Unicode 15.1 class table and the folded text the pre-tokenizer regexes run on."""

from engine.tokenize import unicode_classes as uc


def cls(ch: str) -> str:
    return chr(uc.CLASS_OF[ord(ch)])


def test_classes_of_known_code_points():
    assert [cls(c) for c in "a9 \u0301!$é中٣\u00a0\u200b\U0001F600"] == list("LNWMPSLLNWOS")
    assert cls("\x1c") == uc.OTHER  # not whitespace for llama.cpp, unlike str.isspace()
    assert cls("\U00031350") == uc.LETTER  # CJK Extension H: Unicode 15.0
    assert cls("\u2ffc") == uc.SYMBOL  # added in Unicode 15.1
    assert cls("\u0897") == uc.OTHER  # assigned only in Unicode 16.0: unassigned for llama.cpp


def test_fold_keeps_ascii_and_one_character_per_code_point():
    text = "ab 1\u00e9\u0301\u3000\U0001F600"
    folded = uc.fold(text)
    assert len(folded) == len(text)
    assert folded == "ab 1\xd2\xd4\x0b\xd5"
    assert uc.widen("a\u3000b\u00a0") == "a\x0bb\x0b"
