"""SentencePiece on tiny handmade vocabularies."""

from engine.tokenize import SPMTokenizer, load_tokenizer
from engine.tokenize.vocab import BYTE, CONTROL, NORMAL, Vocab, token_types


def tiny_spm(tokens, scores, types=None, *, add_space_prefix=False, **special) -> SPMTokenizer:
    vocab = Vocab(tokens, token_types(tokens, types), **special)
    return SPMTokenizer(vocab, scores, add_space_prefix=add_space_prefix)


def test_spec_example_score_driven_merges_and_byte_fallback():
    tok = tiny_spm(["<unk>", "a", "b", "ab", "abc", "c", "<0x78>"], [0, -1, -1, -3, -2.5, -1, -5])
    assert tok.encode("abcx") == [4, 6]  # "abc" outscores "ab"; "x" falls back to <0x78>


def test_highest_score_first_ties_go_left():
    tokens = ["a", "aa"]
    assert tiny_spm(tokens, [0, -1]).encode("aaa") == [1, 0]
    tokens = ["a", "b", "c", "ab", "bc"]
    assert tiny_spm(tokens, [0, 0, 0, -2, -1]).encode("abc") == [0, 4]
    assert tiny_spm(tokens, [0, 0, 0, -1, -2]).encode("abc") == [3, 2]


def test_spaces_become_the_word_marker_and_prefix_space_is_added_after_specials():
    tokens = ["<unk>", "<s>", "</s>", "▁a", "a", "▁", "<sep>"]
    types = [CONTROL, CONTROL, CONTROL, NORMAL, NORMAL, NORMAL, CONTROL]
    tok = tiny_spm(tokens, [0, 0, 0, -1, -2, -3, 0], types, add_space_prefix=True,
                   bos_id=1, eos_id=2, unk_id=0, add_bos=True)
    assert tok.encode("a a") == [1, 3, 3]
    assert tok.encode("a<sep>a") == [1, 3, 6, 3]  # llama.cpp prefixes a space after each special
    assert tok.decode([1, 3, 3]) == "<s>a a"  # the added prefix space is dropped again
    assert tok.decode([3, 3]) == "a a"


def test_byte_tokens_decode_to_raw_bytes():
    tokens = ["<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [CONTROL] + [BYTE] * 256
    tok = tiny_spm(tokens, [0] * 257, types, unk_id=0)
    ids = tok.encode("é€")
    assert ids == [1 + b for b in "é€".encode()]
    assert tok.decode(ids) == "é€"


def test_words_are_cut_only_where_no_token_spans():
    tokens = ["a", "▁", "b", ">", "a▁", "▁b", ">▁b"]
    tok = tiny_spm(tokens, [0, 0, 0, 0, -1, -2, -1])
    assert tok._word_starts.split("x>▁b▁b") == ["x>▁b", "▁b"]  # "a▁" and ">▁b" span a "▁"
    assert tok.encode("a b") == [4, 2]
    assert tok.encode("> b") == [6]


def test_metadata_defaults_follow_llama_cpp():
    md = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "▁hi", "hi"],
        "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0],
    }
    tok = load_tokenizer(md)
    assert (tok.bos_id, tok.eos_id, tok.vocab.unk_id, tok.add_bos) == (1, 2, 0, True)
    assert tok.encode("hi") == [1, 3]  # add_space_prefix defaults on
    assert 2 in tok.eog_ids
