"""StreamDecoder: only complete UTF-8 leaves push()."""

from engine.tokenize import StreamDecoder
from engine.tokenize.vocab import BYTE, NORMAL, Vocab, token_types
from engine.tokenize.spm import SPMTokenizer


def byte_tokenizer() -> SPMTokenizer:
    tokens = [f"<0x{b:02X}>" for b in range(256)] + ["▁hi"]
    vocab = Vocab(tokens, token_types(tokens, [BYTE] * 256 + [NORMAL]))
    return SPMTokenizer(vocab, [0.0] * 257, add_space_prefix=False)


def test_a_character_split_across_tokens_is_held_until_complete():
    stream = StreamDecoder(byte_tokenizer())
    euro = "€".encode()  # three bytes, three tokens
    assert [stream.push(256), stream.push(euro[0]), stream.push(euro[1])] == [" hi", "", ""]
    assert stream.push(euro[2]) == "€"


def test_reset_drops_an_unfinished_character():
    stream = StreamDecoder(byte_tokenizer())
    assert stream.push("é".encode()[0]) == ""
    stream.reset()
    assert stream.push(ord("a")) == "a"  # not "\ufffda": the cut bytes are gone
