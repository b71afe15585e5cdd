"""Gemma 4's SentencePiece-style BPE (tokenizer.ggml.model "gemma4") against llama.cpp's tokenization of a tiny
vocabulary of its kind (tests/gemma4_models.py; recorded by tests/data/moe/record_llama_tokens.py)."""

import hashlib
import json
from pathlib import Path

import pytest

from engine.gguf.reader import open_gguf
from engine.tokenize import SpacedBPETokenizer, load_tokenizer
from tests.gemma4_models import write_gemma4_vocab

RECORD = json.loads((Path(__file__).resolve().parents[2] / "data" / "moe" / "gemma4-tokenizer.json").read_text())


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma4-vocab") / "vocab.gguf"
    write_gemma4_vocab(path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == RECORD["gguf_sha256"], (
        "the tests write another vocabulary than llama.cpp's ids were recorded on: re-run "
        "tests/data/moe/record_llama_tokens.py")
    file = open_gguf(path)
    try:
        return load_tokenizer(file.metadata)
    finally:
        file.close()


@pytest.mark.parametrize("case", RECORD["cases"], ids=lambda c: repr(c["text"])[:30])
def test_ids_are_llama_cpps(tokenizer, case):
    assert isinstance(tokenizer, SpacedBPETokenizer)
    assert tokenizer.encode(case["text"]) == case["ids"]
    assert tokenizer.encode(case["text"], add_special=False, parse_special=False) == case["plain"]


@pytest.mark.parametrize("case", RECORD["cases"], ids=lambda c: repr(c["text"])[:30])
def test_texts_round_trip(tokenizer, case):
    assert tokenizer.decode(case["plain"]) == case["text"]


def test_bos_and_the_end_of_generation_set_are_llama_cpps(tokenizer):
    # "</s>" is a normal token here: Gemma 4's turns end with "<turn|>"
    assert (tokenizer.bos_id, tokenizer.add_bos) == (RECORD["bos"], RECORD["add_bos"])
    assert tokenizer.eog_ids == set(RECORD["eog"])
    assert tokenizer.decode([tokenizer.token_id("</s>")]) == "</s>"
