"""Token-ID parity with llama.cpp on every golden text of the three starter models, and round trips."""

import pytest

from tests.golden import MODELS, golden


def golden_cases(model: str) -> list[tuple[str, list[int]]]:
    data = golden(model)
    cases = [(c["text"], c["ids"]) for c in data["tokenize"]]
    cases += [(g["rendered"], g["prompt_ids"]) for g in data["greedy"]]
    cases.append((data["teacher_forced"]["text"], data["teacher_forced"]["ids"]))
    long = golden(model, ".long")
    cases.append((long["text"], long["ids"]))
    return cases


@pytest.mark.parametrize("model", MODELS)
def test_golden_ids_are_exact(real_tokenizer, model):
    tok = real_tokenizer(model)
    data = golden(model)
    assert all(c["add_bos"] == tok.add_bos for c in data["tokenize"])
    mismatches = [(text, ids, got) for text, ids in golden_cases(model) if (got := tok.encode(text)) != ids]
    assert not mismatches, mismatches[0]


@pytest.mark.parametrize("model", MODELS)
def test_golden_texts_round_trip(real_tokenizer, model):
    tok = real_tokenizer(model)
    for text, _ in golden_cases(model):
        ids = tok.encode(text, add_special=False)
        assert tok.decode(ids) == text
        assert tok.decode(tok.encode(text)[1:] if tok.add_bos else tok.encode(text)) == text


@pytest.mark.parametrize("model", MODELS)
def test_greedy_continuations_decode_to_llama_cpp_text(real_tokenizer, model):
    tok = real_tokenizer(model)
    for case in golden(model)["greedy"]:
        ids = [i for i in case["greedy_ids"] if i not in tok.eog_ids]
        assert tok.decode(ids) == case["greedy_text"]


def test_end_of_generation_sets_match_llama_cpp(real_tokenizer):
    # llama.cpp's EOG lists for these files (eos, template end markers, FIM pad/repo/sep, "</s>")
    assert real_tokenizer("smollm2-135m-instruct").eog_ids == {0, 2, 4}
    assert real_tokenizer("qwen2.5-coder-0.5b-instruct").eog_ids == {128247, 151643, 151645, 151662, 151663, 151664}
    assert real_tokenizer("gemma-3-270m").eog_ids == {1, 106, 212}
