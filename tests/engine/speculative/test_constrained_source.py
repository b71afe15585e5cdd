"""ConstrainedSource (spec 13.9.6): forced spans draft themselves, inner drafts are cut at their first
grammar-invalid token and the cut reaches the inner source's accounting; over a real grammar the lookaheads
leave the matcher as they found it."""

import numpy as np

from engine.sampling.grammar import Grammar, grammar_processor
from engine.sampling.processor import StructuredProcessor
from engine.speculative import ConstrainedSource, SpeculationIndex, grammar_aware
from tests.engine.chat.conftest import byte_level_chatml_tokenizer


class Fixed(StructuredProcessor):
    """forcing: the grammar forces [7, 8]; else a free choice where ids >= 3 are invalid."""

    def __init__(self):
        self.forcing = True

    def process(self, logits, history):
        pass

    def commit(self, token):
        pass

    def forced_tokens(self):
        return [7, 8] if self.forcing else []

    def valid_prefix_len(self, tokens):
        if self.forcing:
            return next((i for i, t in enumerate(tokens[:2]) if t != [7, 8][i]), min(len(tokens), 2))
        return next((i for i, t in enumerate(tokens) if t >= 3), len(tokens))


class Inner:
    """Drafts `draft` every time; records what it is told."""

    def __init__(self, draft):
        self.draft, self.truncations, self.observed = list(draft), [], []

    def suggest(self, context, budget):
        return self.draft[:budget]

    def truncate_pending(self, new_len):
        self.truncations.append(new_len)

    def observe(self, committed):
        self.observed.append(list(committed))


def test_a_forced_span_preempts_the_inner_draft():
    processor, inner = Fixed(), Inner([1, 5])
    source = ConstrainedSource(processor, inner)
    assert source.suggest([0], 8) == [7, 8]
    assert inner.truncations == [0]  # the inner draft is not verified, so it is not the inner source's miss
    source.truncate_pending(1)  # a forced span shortened: nothing of the inner source's to shorten
    assert inner.truncations == [0]
    source.observe([7, 9])
    assert inner.observed == [[7, 9]]  # every committed token reaches the inner source
    assert source.suggest([0], 1) == [7]  # the budget caps a forced span


def test_an_inner_draft_is_cut_before_its_first_invalid_token():
    processor, inner = Fixed(), Inner([1, 2, 5, 1])
    processor.forcing = False
    source = ConstrainedSource(processor, inner)
    assert source.suggest([0], 8) == [1, 2]
    assert inner.truncations == [2]
    source.truncate_pending(1)  # a wrapper (the turn boundary, the decoder) shortens it again: forwarded
    assert inner.truncations == [2, 1]
    inner.draft = [4, 1]
    assert source.suggest([0], 8) == [] and inner.truncations[-1] == 0


def test_an_inner_draft_that_goes_on_after_the_forced_span_is_kept():
    processor, inner = Fixed(), Inner([7, 8, 1])
    processor.valid_prefix_len = lambda tokens: len(tokens)
    source = ConstrainedSource(processor, inner)
    assert source.suggest([0], 8) == [7, 8, 1] and inner.truncations == []


def test_the_cascade_is_wrapped_only_for_a_processor_with_structure():
    index = SpeculationIndex(16)
    assert grammar_aware(index, None) is index
    wrapped = grammar_aware(index, Fixed())
    assert isinstance(wrapped, ConstrainedSource) and wrapped.observe_top_k == index.observe_top_k
    assert not hasattr(ConstrainedSource(Fixed(), Inner([])), "observe_top_k")  # no top-K computed for it


def ids(tok, text):
    return tok.encode(text, add_special=False)


def test_over_a_real_grammar_the_lookaheads_leave_the_matcher_as_they_found_it():
    tok = byte_level_chatml_tokenizer()
    end = tok.token_id("<|im_end|>")
    processor = grammar_processor(Grammar("regex", r"(ab ){1,3}ab!"), tok, end)
    # the grammar completes inside this draft: "ab!" and the stop marker are valid, what follows is not
    inner = Inner(ids(tok, "ab!") + [end] + ids(tok, "ab"))
    source = ConstrainedSource(processor, inner)
    committed = []

    def sample_row(token):
        """A verify row: mask (once before and once after drafting: the same), then commit `token`."""
        logits = np.zeros(tok.vocab_size, np.float32)
        processor.process(logits, committed)
        mask = np.isfinite(logits)
        draft = source.suggest(committed, 16)
        logits = np.zeros(tok.vocab_size, np.float32)
        processor.process(logits, committed)
        np.testing.assert_array_equal(np.isfinite(logits), mask)
        assert mask[token], f"{token} masked after {committed}"
        processor.commit(token)
        committed.append(token)
        return draft

    for token in ids(tok, "ab ab "):
        sample_row(token)
    assert source.suggest(committed, 16) == ids(tok, "ab!") + [end]
    for token in ids(tok, "ab!") + [end]:  # the draft's tokens, committed as a verify accepts them
        sample_row(token)
    assert processor.failure is None and processor.finished
    assert inner.truncations.count(len(ids(tok, "ab!")) + 1) >= 1  # the cut reached the inner accounting


def test_a_forced_span_is_marked_forced_and_an_inner_draft_is_not():
    processor, inner = Fixed(), Inner([1, 5])
    source = ConstrainedSource(processor, inner)
    source.suggest([0], 1)
    assert source.last_forced  # the decoder verifies it though it is shorter than the minimum draft
    processor.forcing = False
    inner.draft = [1, 2]
    source.suggest([0], 8)
    assert not source.last_forced
