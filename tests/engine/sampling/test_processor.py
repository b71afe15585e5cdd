"""The logit-processor seam: mask before sampling, observe the selection (spec 13.6's example)."""

import numpy as np
import pytest

from engine.errors import AllTokensMasked
from engine.sampling import LogitProcessor, Sampler, SamplerConfig, StructuredProcessor, has_structure


class OddMask(LogitProcessor):
    def __init__(self):
        self.commits: list[int] = []
        self.seen_history = None

    def process(self, logits, history):
        logits[1::2] = -np.inf
        self.seen_history = list(history)

    def commit(self, token):
        self.commits.append(token)


class ForcedLiteral(StructuredProcessor):
    """Forces the tokens of a fixed literal, one by one."""

    def __init__(self, literal):
        self.literal, self.pos = list(literal), 0

    def process(self, logits, history):
        keep = logits[self.literal[self.pos]]
        logits[:] = -np.inf
        logits[self.literal[self.pos]] = keep

    def commit(self, token):
        self.pos += 1

    def reset(self):
        self.pos = 0

    def forced_tokens(self):
        return self.literal[self.pos:]

    def valid_prefix_len(self, tokens):
        n = 0
        for a, b in zip(tokens, self.literal[self.pos:]):
            if a != b:
                break
            n += 1
        return n


def test_mask_before_sampling_observe_the_selection():
    mask = OddMask()
    s = Sampler(processor=mask)
    logits = np.array([0.1, 0.9, 0.5, 0.8], dtype=np.float32)
    assert s.sample(logits, history=[3]) == 2  # unmasked argmax would be 1
    assert mask.commits == [2]
    assert mask.seen_history == [3]
    assert logits[1] == np.float32(0.9)  # the caller's row is left alone


def test_commit_once_per_sampled_token():
    mask = OddMask()
    s = Sampler(SamplerConfig(temperature=1.0, seed=5), processor=mask)
    picks = [s.sample(np.zeros(6, dtype=np.float32)) for _ in range(20)]
    assert mask.commits == picks
    assert all(p % 2 == 0 for p in picks)


def test_structural_hooks():
    forced = ForcedLiteral([4, 0, 2])
    assert has_structure(forced) and not has_structure(OddMask()) and not has_structure(None)
    s = Sampler(SamplerConfig(temperature=1.0, seed=0), processor=forced)
    assert forced.valid_prefix_len([4, 0, 3]) == 2
    out = [s.sample(np.zeros(5, dtype=np.float32)) for _ in range(2)]
    assert out == [4, 0] and forced.forced_tokens() == [2]
    forced.reset()
    assert forced.forced_tokens() == [4, 0, 2]


def test_a_processor_that_masks_everything_is_an_error():
    class MaskAll(OddMask):
        def process(self, logits, history):
            logits[:] = -np.inf

    mask = MaskAll()
    with pytest.raises(AllTokensMasked):
        Sampler(processor=mask).sample(np.ones(3, dtype=np.float32))
    assert mask.commits == []
