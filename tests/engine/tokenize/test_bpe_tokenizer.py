"""Byte-level BPE on tiny handmade vocabularies."""

import logging

import numpy as np
import pytest

from engine.tokenize import BPETokenizer, load_tokenizer
from engine.tokenize.bpe import BYTE_CHARS
from engine.tokenize.vocab import CONTROL, NORMAL, USER_DEFINED, Vocab, token_types


def tiny_bpe(tokens, merges, types=None, pre="qwen2", **special) -> BPETokenizer:
    return BPETokenizer(Vocab(tokens, token_types(tokens, types), **special), merges, pre)


def test_spec_example_merges_and_resolves_markers():
    tok = tiny_bpe(["<|im_end|>", "h", "i", "hi"], ["h i"])
    ids = tok.encode("hi<|im_end|>")
    assert ids == [3, 0]
    assert tok.decode(ids) == "hi<|im_end|>"


def test_lowest_rank_merges_first_and_ties_go_left():
    tokens = ["a", "b", "c", "ab", "bc", "aa", "aaa"]
    # "bc" outranks "ab", so "abc" -> a + bc
    assert tiny_bpe(tokens, ["b c", "a b"]).encode("abc") == [0, 4]
    assert tiny_bpe(tokens, ["a b", "b c"]).encode("abc") == [3, 2]
    # equal pairs: the leftmost merges first, so "aaa" -> aa + a, never a + aa
    assert tiny_bpe(tokens, ["a a", "aa a"]).encode("aaa") == [6]
    assert tiny_bpe(tokens, ["a a"]).encode("aaa") == [5, 0]


def test_bytes_are_spelled_in_the_gpt2_alphabet():
    tokens = list(BYTE_CHARS) + ["Ġh"]
    tok = tiny_bpe(tokens, ["Ġ h"])
    assert tok.encode(" h") == [256]  # the space byte is spelled "Ġ"
    assert tok.encode("é") == [0xC3, 0xA9]  # two UTF-8 bytes, two byte tokens
    assert tok.decode([256, 0xC3, 0xA9]) == " hé"


def test_parse_special_off_keeps_control_tokens_as_text_but_user_defined_whole():
    tokens = list(BYTE_CHARS) + ["<|im_end|>", "<tool>"]
    types = [NORMAL] * 256 + [CONTROL, USER_DEFINED]
    tok = tiny_bpe(tokens, [], types)
    assert tok.encode("<|im_end|><tool>") == [256, 257]
    def spelled(text):
        return [BYTE_CHARS.index(c) for c in text]

    assert tok.encode("<|im_end|><tool>", parse_special=False) == spelled("<|im_end|>") + [257]
    assert tok.encode_plain("<|im_end|><tool>") == spelled("<|im_end|><tool>")


def test_bos_eos_policy():
    tokens = ["<s>", "</s>", "a"]
    tok = tiny_bpe(tokens, [], bos_id=0, eos_id=1, add_bos=True, add_eos=True)
    assert tok.encode("a") == [0, 2, 1]
    assert tok.encode("a", add_special=False) == [2]
    assert tok.encode("") == [0, 1]
    assert 1 in tok.eog_ids and 0 not in tok.eog_ids


def test_decode_skips_special_on_request():
    tok = tiny_bpe(["<|im_end|>", "h", "i", "hi"], ["h i"])
    assert tok.decode([3, 0], skip_special=True) == "hi"
    assert tok.decode_bytes([3, 0]) == b"hi<|im_end|>"
    assert tok.token_bytes(0) == b"<|im_end|>"
    with pytest.raises(IndexError):
        tok.token_bytes(4)


def test_ignore_merges_keeps_whole_word_tokens_for_llama3():
    tokens = ["a", "b", "c", "ab", "abc"]
    # no merge reaches "abc"; Llama 3 vocabularies still take it whole
    assert tiny_bpe(tokens, ["a b"], pre="llama-bpe").encode("abc") == [4]
    assert tiny_bpe(tokens, ["a b"], pre="qwen2").encode("abc") == [3, 2]


def test_unknown_pre_tokenizer_warns_and_uses_qwen2_rules(caplog):
    with caplog.at_level(logging.WARNING):
        tok = tiny_bpe(list(BYTE_CHARS), [], pre="brand-new-pre")
    assert tok.pre_mismatch == "brand-new-pre"
    assert tok.pretokenizer.name == "qwen2"
    assert "brand-new-pre" in caplog.text
    assert tiny_bpe(list(BYTE_CHARS), [], pre="qwen2").pre_mismatch is None


def test_metadata_defaults_follow_llama_cpp():
    md = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(20)] + ["<|eot_id|>"],
        "tokenizer.ggml.merges": ["t 1"],
    }
    tok = load_tokenizer(md)
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (11, 11, True)  # llama.cpp's BPE defaults
    assert 20 in tok.eog_ids and tok.vocab.types[20] == CONTROL  # promoted by its text
    md["tokenizer.ggml.add_bos_token"] = False
    md["tokenizer.ggml.bos_token_id"] = np.uint32(3)
    tok = load_tokenizer(md)
    assert (tok.bos_id, tok.add_bos) == (3, False)


def test_word_cache_starts_over_when_full(monkeypatch):
    from engine.tokenize import base

    monkeypatch.setattr(base, "_CACHE_LIMIT", 4)
    tok = tiny_bpe(list(BYTE_CHARS), [])
    first, second = "ab cd", "ef gh ij kl"
    assert tok.decode(tok.encode(first)) == first
    assert tok.decode(tok.encode(second)) == second  # overflows: the cache is rebuilt for this text
    assert set(tok._words) == {"ef", " gh", " ij", " kl"}
    assert tok.decode(tok.encode(first)) == first


def test_harmony_ends_a_reply_at_return_or_call_not_at_a_messages_end():
    # gpt-oss: <|end|> closes the reasoning's message, and the final answer follows (llama.cpp's workaround)
    harmony = tiny_bpe(["<|end|>", "<|return|>", "<|call|>", "a"], [], eos_id=1)
    assert {0, 1, 2} & harmony.eog_ids == {1, 2}
    alone = tiny_bpe(["<|end|>", "a"], [], eos_id=1)  # a model whose turns end at <|end|> (Phi-3)
    assert 0 in alone.eog_ids
