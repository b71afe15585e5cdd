"""Grammar-constrained sampling (engine.sampling.grammar) over tiny tokenizers and random logits: the
tokenizer bridge, grammar errors at set time, the mask, the forced stop, failure, reset, clone and the
structural hooks."""

import json
import logging
import re

import numpy as np
import pytest

from engine.errors import InvalidGrammar
from engine.sampling import Sampler, SamplerConfig, has_structure
from engine.sampling.grammar import Grammar, GrammarProcessor, grammar_processor, grammar_vocabulary
from engine.tokenize.vocab import BYTE, CONTROL, NORMAL, Vocab, token_types
from engine.tokenize import SPMTokenizer
from tests.engine.chat.conftest import byte_level_chatml_tokenizer


@pytest.fixture(scope="module")
def tok():
    return byte_level_chatml_tokenizer()


def run(processor: GrammarProcessor, tok, *, seed=0, temperature=0.0, steps=40, rows=None, bias=None):
    """Sample random logits through the processor until its stop token: the reply's ids."""
    rng = np.random.default_rng(seed)
    sampler = Sampler(SamplerConfig(temperature=temperature, seed=seed), processor)
    out = []
    for _ in range(steps):
        logits = rng.normal(size=rows or tok.vocab_size).astype(np.float32)
        if bias is not None:
            logits[bias] += 100.0
        token = sampler.sample(logits, out)
        if token == processor.stop_id:
            return out
        out.append(token)
    raise AssertionError(f"no stop after {steps} tokens: {tok.decode(out)!r}")


# -- the bridge ---------------------------------------------------------------------------------------

def test_bpe_bridge_hands_llguidance_raw_bytes_and_marks_control_tokens_special(tok):
    ll = grammar_vocabulary(tok).ll
    space = tok.vocab.ids["Ġ"]  # GPT-2's stand-in for the space byte
    assert ll.decode_bytes([space, tok.vocab.ids["hi"]]) == b" hi"
    im_end = tok.token_id("<|im_end|>")
    assert ll.is_special_token(im_end) and ll.is_special_token(tok.token_id("<|im_start|>"))
    assert not ll.is_special_token(space)
    assert grammar_vocabulary(tok) is grammar_vocabulary(tok)  # built once, shared


def test_spm_bridge_unescapes_word_marks_and_byte_tokens():
    tokens = ["<unk>", "<s>", "</s>", "▁a", "b", "<0x78>"]
    vocab = Vocab(tokens, token_types(tokens, [CONTROL, CONTROL, CONTROL, NORMAL, NORMAL, BYTE]),
                  bos_id=1, eos_id=2, unk_id=0)
    spm = SPMTokenizer(vocab, [0, 0, 0, -1, -1, -1])
    ll = grammar_vocabulary(spm).ll
    assert [ll.decode_bytes([i]) for i in (3, 4, 5)] == [b" a", b"b", b"x"]
    assert all(ll.is_special_token(i) for i in (0, 1, 2)) and not ll.is_special_token(3)
    ids = run(grammar_processor(Grammar("regex", "( a|b|x){3}"), spm), spm)
    assert re.fullmatch("( a|b|x){3}", spm.decode_bytes(ids).decode())


# -- grammars -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, source, message", [
    ("regex", "a(b", "unclosed group"),
    ("lark", "start: foo", 'unknown name: "foo"'),
    ("json_schema", "{not json", "not valid JSON"),
    ("json_schema", "[1, 2]", "a JSON schema is a JSON object"),
    ("json_schema", '{"type": "bogus"}', "Invalid type: bogus"),
    ("gbnf", 'root ::= "a', "GBNF"),
    ("yaml", "a: b", "unknown grammar kind 'yaml'"),
])
def test_an_invalid_grammar_fails_when_it_is_made_with_llguidances_message(kind, source, message):
    with pytest.raises(InvalidGrammar, match=re.escape(message)):
        Grammar(kind, source)


def test_gbnf_is_converted_by_llguidance_and_constrains(tok):
    ids = run(grammar_processor(Grammar("gbnf", 'root ::= "hi" [0-9]+ "!"'), tok), tok)
    assert re.fullmatch(r"hi[0-9]+!", tok.decode(ids))


def test_a_stored_response_format_round_trips_and_free_means_none():
    grammar = Grammar("regex", "[ab]+")
    assert Grammar.from_setting(grammar.as_setting()) == grammar
    assert Grammar.from_setting(None) is None and Grammar.from_setting({"type": "free"}) is None
    with pytest.raises(InvalidGrammar, match="response format"):
        Grammar.from_setting("regex")


# -- the processor on the sampler's seam -------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_sampled_replies_match_the_regex_and_end_on_the_stop_token(tok, seed, temperature):
    pattern = r"(hi|[a-f]{1,3}) [0-9]{2}"
    ids = run(grammar_processor(Grammar("regex", pattern), tok), tok, seed=seed, temperature=temperature)
    assert re.fullmatch(pattern, tok.decode(ids))


def test_lark_and_json_object(tok):
    lark = 'start: "(" item ("," item)* ")"\nitem: /[a-c]/ | "hi"'
    text = tok.decode(run(grammar_processor(Grammar("lark", lark), tok), tok, temperature=1.0, steps=200))
    assert re.fullmatch(r"\((?:[a-c]|hi)(?:,(?:[a-c]|hi))*\)", text)
    assert isinstance(json.loads(tok.decode(run(grammar_processor(Grammar.json_object(), tok), tok, steps=400))), dict)


def test_a_grammar_spelling_a_control_token_never_yields_it(tok):
    """The text "<|im_end|>" is spelled with byte tokens, even when the control token's logit dominates."""
    im_end = tok.token_id("<|im_end|>")
    processor = grammar_processor(Grammar("regex", r"a<\|im_end\|>b"), tok, stop_id=im_end)
    ids = run(processor, tok, bias=im_end, steps=20)
    assert im_end not in ids and tok.decode(ids) == "a<|im_end|>b"


def test_padded_output_rows_are_never_allowed(tok):
    processor = grammar_processor(Grammar("regex", "[a-z]+"), tok)
    logits = np.zeros(tok.vocab_size + 13, np.float32)
    processor.process(logits, [])
    assert np.all(logits[tok.vocab_size:] == -np.inf) and np.isfinite(logits[tok.vocab.ids["a"]])
    assert processor.valid_prefix_len([tok.vocab.ids["a"], tok.vocab_size + 2, tok.vocab.ids["b"]]) == 1


def test_when_the_grammar_completes_only_the_stop_token_is_allowed(tok):
    """The bridge's end-of-sequence id is mapped onto the processor's stop token (here another id)."""
    stop = tok.token_id("<|im_start|>")
    processor = grammar_processor(Grammar("regex", "hi"), tok, stop_id=stop)
    sampler = Sampler(SamplerConfig(), processor)
    assert sampler.sample(np.zeros(tok.vocab_size, np.float32)) == tok.vocab.ids["hi"]
    logits = np.zeros(tok.vocab_size, np.float32)
    processor.process(logits, [])
    assert np.flatnonzero(np.isfinite(logits)).tolist() == [stop]
    assert processor.finished and processor.forced_tokens() == [stop]
    assert sampler.sample(np.zeros(tok.vocab_size, np.float32)) == stop and processor.failure is None


def test_a_matcher_failure_mid_reply_degrades_to_the_forced_stop_and_is_logged(tok, caplog):
    processor = grammar_processor(Grammar("regex", "[ab]+"), tok)
    with caplog.at_level(logging.WARNING, "engine.sampling.grammar"):
        processor.commit(tok.vocab.ids["z"])  # a token the mask would have removed
    assert processor.failure and "failed mid-reply" in caplog.text
    logits = np.zeros(tok.vocab_size, np.float32)
    processor.process(logits, [])
    assert np.flatnonzero(np.isfinite(logits)).tolist() == [processor.stop_id]
    processor.reset()  # the next turn starts clean
    assert processor.failure is None
    assert re.fullmatch("[ab]+", tok.decode(run(processor, tok)))


def test_reset_rearms_and_clone_is_independent(tok):
    processor = grammar_processor(Grammar("regex", "(ab|ba)c"), tok)
    first = run(processor, tok, seed=1)
    twin = processor.clone()  # at the end of a reply: its own matcher in the same (finished) state
    assert twin.finished
    processor.reset()
    assert not processor.finished and twin.finished
    assert run(processor, tok, seed=1) == first
    processor.reset()
    fresh = processor.clone()
    fresh.commit(tok.vocab.ids["a"])
    assert processor.valid_prefix_len([tok.vocab.ids["b"]]) == 1 and fresh.valid_prefix_len([tok.vocab.ids["b"]]) == 1
    assert fresh.valid_prefix_len([tok.vocab.ids["a"]]) == 0 and processor.valid_prefix_len([tok.vocab.ids["a"]]) == 1


def test_structural_hooks_forced_tokens_and_valid_prefix_len(tok):
    processor = grammar_processor(Grammar("regex", "(hello|help) [xy]"), tok)
    assert has_structure(processor)
    h, e, l, o, p = (tok.vocab.ids[c] for c in "helop")
    assert processor.forced_tokens() == [h, e, l]  # both words start "hel"
    processor.commit(h)
    assert processor.forced_tokens() == [e, l]  # "el" is the only way on
    assert processor.valid_prefix_len([e, l, p, tok.vocab.ids["Ġ"], o]) == 4
    assert processor.valid_prefix_len([e, tok.vocab.ids["hi"]]) == 1
    assert processor.forced_tokens() == [e, l]  # lookaheads changed nothing
    for token in (e, l, l, o):
        processor.commit(token)
    assert processor.forced_tokens() == [tok.vocab.ids["Ġ"]]
    processor.commit(tok.vocab.ids["Ġ"])
    assert processor.forced_tokens() == []  # x or y


def test_valid_prefix_len_agrees_with_the_mask_on_the_end_of_sequence_id(tok):
    """With a stop token other than the bridge's end id, "may end here" is the stop token: the end id under
    its own name is masked, so a draft holding it is cut there."""
    stop = tok.token_id("<|im_start|>")
    processor = grammar_processor(Grammar("regex", "a+"), tok, stop_id=stop)
    processor.commit(tok.vocab.ids["a"])
    logits = np.zeros(tok.vocab_size, np.float32)
    processor.process(logits, [])
    assert not np.isfinite(logits[tok.eos_id]) and np.isfinite(logits[stop])
    assert processor.valid_prefix_len([tok.eos_id]) == 0
    assert processor.valid_prefix_len([tok.vocab.ids["a"], stop, tok.vocab.ids["a"]]) == 2


def test_json_replies_are_one_line_with_fixed_separators_so_structure_is_forced(tok):
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}, "b": {"type": "integer"}},
              "required": ["a", "b"]}
    processor = grammar_processor(Grammar("json_schema", json.dumps(schema)), tok)
    compact = tok.encode_plain('{"a": "xyz", "b": 1}')
    assert processor.valid_prefix_len(compact) == len(compact)
    pretty = tok.encode_plain('{\n  "a": "xyz"')
    assert processor.valid_prefix_len(pretty) == len(tok.encode_plain('{'))  # no newline: no loop on them
    assert processor.valid_prefix_len(tok.encode_plain('{"a" : ')) == len(tok.encode_plain('{"a"'))
    processor.commit(tok.encode_plain('{')[0])
    assert tok.decode(processor.forced_tokens()) == '"a": "'  # the key and its separators draft themselves


def test_the_shared_bridge_does_not_keep_its_tokenizer_alive():
    import gc
    import weakref
    tokenizer = byte_level_chatml_tokenizer()
    grammar_vocabulary(tokenizer)
    gone = weakref.ref(tokenizer)
    del tokenizer
    gc.collect()
    assert gone() is None
