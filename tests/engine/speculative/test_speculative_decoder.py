"""The lossless contract: the speculative stream is the plain stream, token for token, draw for draw."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import AllTokensMasked, InvalidDecodeState, InvalidSpeculationConfig
from engine.sampling.processor import LogitProcessor
from engine.sampling.sampler import Sampler, SamplerConfig, top_ids
from engine.speculative.cascade import SpeculationIndex
from engine.speculative.decoder import SpecOptions, SpeculativeDecoder
from engine.speculative.gate import CostGate
from tests.engine.speculative.fakes import STOP, FakeModel, FakeTarget, plain_run, prefill, spec_run

CONFIGS = {
    "greedy": SamplerConfig(),
    "sampled": SamplerConfig(temperature=0.9, top_k=20, top_p=0.9, min_p=0.05, repeat_penalty=1.1, seed=7),
    "nucleus": SamplerConfig(temperature=0.7, top_p=0.8, freq_penalty=0.2, presence_penalty=0.1,
                             repeat_last_n=-1, seed=3),
}
PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 1, 2], [4, 4, 4, 2, 1, 3, 9, 8], [6, 1, 2, 3]]
MODEL = FakeModel()


class Oracle:
    """Drafts the plain run's own samples (stop tokens included, so a stop sits inside a draft), then
    padding; `corrupt` spoils the draft at that offset so corrections happen too."""

    def __init__(self, sampled_per_turn, corrupt=None, vocab=MODEL.vocab):
        self.turns = sampled_per_turn
        self.corrupt, self.vocab = corrupt, vocab
        self.turn, self.pos = -1, 0
        self.truncations = []

    def start_turn(self, t, decoder, history):
        self.turn, self.pos = t, 0

    def suggest(self, context, budget):
        truth = self.turns[self.turn][self.pos:] + [1, 2, 3, 4]
        draft = truth[:budget]
        if self.corrupt is not None and len(draft) > self.corrupt:
            draft[self.corrupt] = (draft[self.corrupt] + 1) % self.vocab
        return draft

    def observe(self, committed):
        self.pos += len(committed)

    def truncate_pending(self, n):
        self.truncations.append(n)


class Liar(Oracle):
    """Oracle drafts wrapped in every way a source can misbehave."""

    def suggest(self, context, budget):
        draft = super().suggest(context, budget * 3)  # over budget
        mode = self.pos % 5
        if mode == 0:
            return np.array(draft)  # numpy ints are fine
        if mode == 1:
            return draft[:2] + [self.vocab + 7] + draft[2:]  # out of vocabulary after 2 tokens
        if mode == 2:
            return [-1] + draft  # nothing usable
        if mode == 3:
            return None
        return draft[:1] + ["x"] + draft[1:]  # not a token id: a 1-token draft, below min_draft


class BanLastAndModulo(LogitProcessor):
    """A stateful mask: bans the token it last committed, and ids congruent to len(history) mod 7."""

    def __init__(self):
        self.last = None
        self.commits = 0

    def process(self, logits, history):
        if self.last is not None:
            logits[self.last] = -np.inf
        logits[len(history) % 7::7] = -np.inf

    def commit(self, token):
        self.last = token
        self.commits += 1


def cascade_decoder(options=None, gate=None):
    def make(target, sampler):
        index = SpeculationIndex(MODEL.vocab)
        return SpeculativeDecoder(target, sampler, index, vocab_size=MODEL.vocab,
                                  options=options or SpecOptions(stop_tokens=frozenset({STOP})), gate=gate)
    return make


def sync_cascade(t, decoder, history):
    decoder.source.sync(history)


def source_decoder(source, options=None):
    def make(target, sampler):
        return SpeculativeDecoder(target, sampler, source, vocab_size=MODEL.vocab,
                                  options=options or SpecOptions(stop_tokens=frozenset({STOP})))
    return make


def assert_same(plain, spec):
    assert spec.replies == plain.replies
    assert spec.ends == plain.ends
    assert spec.history == plain.history
    assert spec.sampled == plain.sampled
    assert spec.draws == plain.draws


@pytest.mark.parametrize("name", CONFIGS)
def test_cascade_stream_equals_plain(name):
    plain = plain_run(MODEL, Sampler(CONFIGS[name]), PROMPTS)
    spec, decoder = spec_run(MODEL, Sampler(CONFIGS[name]), PROMPTS, cascade_decoder(), on_turn=sync_cascade)
    assert_same(plain, spec)
    assert "stop" in plain.ends and "length" in plain.ends  # both turn endings are exercised
    s = decoder.stats
    assert s.committed == sum(map(len, spec.replies))
    assert s.spec_steps > 0 and s.accepted > 0  # drafts were verified and some accepted
    assert s.steps < s.committed  # fewer steps than tokens: speculation did work


configs = st.builds(
    SamplerConfig, temperature=st.sampled_from([0.0, 0.5, 1.0, 1.5]), top_k=st.sampled_from([0, 1, 5, 40]),
    top_p=st.sampled_from([1.0, 0.9, 0.5]), min_p=st.sampled_from([0.0, 0.05, 0.3]),
    repeat_penalty=st.sampled_from([1.0, 1.3]), repeat_last_n=st.sampled_from([0, 8, -1]), seed=st.integers(0, 99))


@settings(max_examples=25, deadline=None)
@given(config=configs, model_seed=st.integers(0, 5), max_draft=st.integers(2, 16),
       prompts=st.lists(st.lists(st.integers(0, 47), min_size=1, max_size=8), min_size=1, max_size=3))
def test_any_configuration_streams_like_plain(config, model_seed, max_draft, prompts):
    model = FakeModel(seed=model_seed)
    plain = plain_run(model, Sampler(config), prompts, max_tokens=30)
    options = SpecOptions(max_draft=max_draft, stop_tokens=frozenset({STOP}))

    def make(target, sampler):
        return SpeculativeDecoder(target, sampler, SpeculationIndex(model.vocab), vocab_size=model.vocab,
                                  options=options)

    spec, _ = spec_run(model, Sampler(config), prompts, make, max_tokens=30, on_turn=sync_cascade)
    assert_same(plain, spec)


@pytest.mark.parametrize("name", CONFIGS)
def test_one_draw_per_sampled_token(name):
    plain = plain_run(MODEL, Sampler(CONFIGS[name]), PROMPTS)
    spec, _ = spec_run(MODEL, Sampler(CONFIGS[name]), PROMPTS, cascade_decoder(), on_turn=sync_cascade)
    sampled = sum(map(len, spec.sampled))  # committed tokens plus the stop tokens that ended turns
    assert spec.draws == plain.draws == (0 if name == "greedy" else sampled)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("corrupt", [None, 0, 2])
def test_oracle_drafts_with_stops_inside_and_corrections(name, corrupt):
    plain = plain_run(MODEL, Sampler(CONFIGS[name]), PROMPTS)
    oracle = Oracle(plain.sampled, corrupt)
    stops_after_accepted = []

    def on_step(result, target, history):
        if result.stopped and result.committed:
            stops_after_accepted.append(result)

    spec, decoder = spec_run(MODEL, Sampler(CONFIGS[name]), PROMPTS, source_decoder(oracle),
                             on_turn=oracle.start_turn, on_step=on_step)
    assert_same(plain, spec)
    s = decoder.stats
    if corrupt is None:
        assert stops_after_accepted  # a stop token inside an accepted draft ended the row loop
        assert s.bonus > 0 and s.rejected_steps == 0
    else:
        assert s.rejected_steps > 0


@pytest.mark.parametrize("name", CONFIGS)
def test_a_lying_source_is_clamped(name):
    plain = plain_run(MODEL, Sampler(CONFIGS[name]), PROMPTS)
    liar = Liar(plain.sampled)
    spec, decoder = spec_run(MODEL, Sampler(CONFIGS[name]), PROMPTS, source_decoder(liar),
                             on_turn=liar.start_turn)
    assert_same(plain, spec)
    assert decoder.stats.accepted > 0 and decoder.stats.fallback_steps > 0
    assert 0 in liar.truncations and 2 in liar.truncations and 16 in liar.truncations


@pytest.mark.parametrize("name", ["greedy", "sampled"])
def test_masking_processor_stays_in_step(name):
    plain_proc, spec_proc = BanLastAndModulo(), BanLastAndModulo()
    plain = plain_run(MODEL, Sampler(CONFIGS[name], plain_proc), PROMPTS)
    spec, decoder = spec_run(MODEL, Sampler(CONFIGS[name], spec_proc), PROMPTS, cascade_decoder(),
                             on_turn=sync_cascade)
    assert_same(plain, spec)
    assert spec_proc.commits == plain_proc.commits == sum(map(len, plain.sampled))
    assert decoder.stats.accepted > 0


def test_stop_sequence_hook_and_token_budget():
    prompts = [[1, 2, 3, 1, 2], [3, 1, 2, 3]]
    for name in CONFIGS:
        plain = plain_run(MODEL, Sampler(CONFIGS[name]), prompts, max_tokens=25, stop_sequence=(3, 1))
        oracle = Oracle(plain.sampled)
        spec, _ = spec_run(MODEL, Sampler(CONFIGS[name]), prompts, source_decoder(oracle), max_tokens=25,
                           stop_sequence=(3, 1), on_turn=oracle.start_turn)
        assert_same(plain, spec)


def test_context_capacity_bounds_the_draft():
    prompt = [1, 2, 3, 4, 1, 2, 3]  # a reply that runs past 50 tokens without a stop
    for capacity in (20, 23, 31, 60):
        plain = plain_run(MODEL, Sampler(CONFIGS["sampled"]), [prompt], max_tokens=100, capacity=capacity)
        oracle = Oracle(plain.sampled)  # would draft 16 tokens past the cache's end
        spec, _ = spec_run(MODEL, Sampler(CONFIGS["sampled"]), [prompt], source_decoder(oracle),
                           max_tokens=100, capacity=capacity, on_turn=oracle.start_turn)
        assert_same(plain, spec)
        assert plain.ends == ["context"]


@pytest.mark.parametrize("name", ["greedy", "sampled"])
def test_a_failing_verify_drops_its_rows_and_decoding_continues(name):
    plain = plain_run(MODEL, Sampler(CONFIGS[name]), PROMPTS)
    oracle = Oracle(plain.sampled)
    spec, _ = spec_run(MODEL, Sampler(CONFIGS[name]), PROMPTS, source_decoder(oracle),
                       on_turn=oracle.start_turn, fail_calls=(3, 4, 7))
    assert_same(plain, spec)
    assert spec.failed_verifies == 3


def test_a_sampler_error_mid_rows_keeps_the_state_consistent():
    class MaskAllAt(LogitProcessor):
        def __init__(self, at):
            self.at = at

        def process(self, logits, history):
            if len(history) == self.at:
                logits[:] = -np.inf

        def commit(self, token):
            pass

    prompt = [1, 2, 3, 1, 2]
    config = CONFIGS["sampled"]
    plain = plain_run(MODEL, Sampler(config), [prompt], max_tokens=30)
    at = len(prompt) + 3  # the third row of the first draft: two draft tokens are accepted before it
    assert len(plain.sampled[0]) > 3
    oracle = Oracle(plain.sampled)
    target = FakeTarget(MODEL)
    sampler = Sampler(config, MaskAllAt(at))
    decoder = SpeculativeDecoder(target, sampler, oracle, vocab_size=MODEL.vocab,
                                 options=SpecOptions(max_draft=16, stop_tokens=frozenset({STOP})))
    history = []
    logits = prefill(target, history, prompt)
    oracle.start_turn(0, decoder, history)
    decoder.bootstrap(logits, history)
    with pytest.raises(AllTokensMasked):
        while True:
            decoder.step(history)
    assert history == plain.history[:at]  # the tokens committed before the failing row stay committed
    assert len(target) == len(history) - 1 and target.positions == history[:-1]
    assert oracle.pos == at - len(prompt)  # the source observed exactly those tokens


def test_topk_feedback_covers_exactly_the_committed_inputs():
    class Recorder(Oracle):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.rows = []

        def observe_top_k(self, rows):
            self.rows.append(rows)

    config = CONFIGS["sampled"]
    plain = plain_run(MODEL, Sampler(config), PROMPTS[:1])
    rec = Recorder(plain.sampled, corrupt=3)
    seen = []
    spec, _ = spec_run(MODEL, Sampler(config), PROMPTS[:1], source_decoder(rec, SpecOptions(
        topk_feedback=4, stop_tokens=frozenset({STOP}))), on_turn=rec.start_turn,
        on_step=lambda r, t, h: seen.append(list(h)))
    assert_same(plain, spec)
    history = spec.history
    for rows in rec.rows:
        for row in rows:
            assert len(row.topk) == 4
    flat = [row for rows in rec.rows for row in rows]
    prompt_len = len(PROMPTS[0])
    # every committed token but the last was the input of exactly one verified row, in order
    assert [row.token for row in flat] == history[prompt_len:len(history) - (spec.ends[0] != "stop")]
    for i, row in enumerate(flat):
        context = history[: prompt_len + i + 1]
        assert list(row.topk) == top_ids(MODEL.logits(context), 4).tolist()


def test_gate_decides_when_not_what():
    cheap = {m: 1.0 + 0.05 * (m - 1) for m in range(1, 18)}
    dear = {m: float(m) * 2 for m in range(1, 18)}  # every row costs two plain steps: never worth it
    for table in (cheap, dear):
        for name in ("greedy", "sampled"):
            gate = CostGate(table, reprobe_after=4, probe_steps=2)
            plain = plain_run(MODEL, Sampler(CONFIGS[name]), PROMPTS)
            spec, decoder = spec_run(MODEL, Sampler(CONFIGS[name]), PROMPTS, cascade_decoder(gate=gate),
                                     on_turn=sync_cascade)
            assert_same(plain, spec)
            if table is dear:
                assert decoder.stats.disabled_steps > 0


def test_a_clock_feeds_measured_verify_times_to_the_gate():
    ticks = iter(range(10 ** 6))
    gate = CostGate({1: 1.0, 17: 2.0})
    make = cascade_decoder(gate=gate)

    def with_clock(target, sampler):
        decoder = make(target, sampler)
        decoder.clock = lambda: float(next(ticks))
        return decoder

    plain = plain_run(MODEL, Sampler(CONFIGS["greedy"]), PROMPTS)
    spec, _ = spec_run(MODEL, Sampler(CONFIGS["greedy"]), PROMPTS, with_clock, on_turn=sync_cascade)
    assert_same(plain, spec)
    assert gate.seconds(1) == pytest.approx(1.0)  # each verify "took" 1 s; the plain entry matches
    # measured verifies over m > 1 rows also "took" 1 s: they cost one plain step, unmeasured ones the table
    assert min(gate.cost(m) for m in range(2, 18)) == pytest.approx(1.0)


def test_step_needs_the_state_bootstrap_left():
    target = FakeTarget(MODEL)
    decoder = SpeculativeDecoder(target, Sampler(), SpeculationIndex(MODEL.vocab), vocab_size=MODEL.vocab)
    history = []
    with pytest.raises(InvalidDecodeState, match="bootstrap"):
        decoder.step([1, 2])
    logits = prefill(target, history, [1, 2, 3])
    decoder.bootstrap(logits, history)
    decoder.step(history)
    history.append(7)  # committed behind the decoder's back
    with pytest.raises(InvalidDecodeState, match="cache holds"):
        decoder.step(history)
    with pytest.raises(InvalidDecodeState, match="whole history"):
        decoder.bootstrap(logits, history + [1, 2, 3])


def test_bootstrap_takes_the_last_row_of_the_prefill():
    committed = []
    for whole in (False, True):
        target, history = FakeTarget(MODEL), []
        history.extend([1, 2, 3])
        rows = target.feed(history)
        decoder = SpeculativeDecoder(target, Sampler(CONFIGS["sampled"]), SpeculationIndex(MODEL.vocab),
                                     vocab_size=MODEL.vocab)
        committed.append(decoder.bootstrap(rows if whole else rows[-1], history).committed)
    assert committed[0] == committed[1] and len(committed[0]) == 1


def test_a_stop_ends_the_turn_until_the_next_bootstrap():
    target = FakeTarget(MODEL)
    decoder = SpeculativeDecoder(target, Sampler(), SpeculationIndex(MODEL.vocab), vocab_size=MODEL.vocab,
                                 options=SpecOptions(stop_tokens=frozenset(range(MODEL.vocab))))
    history = []
    result = decoder.bootstrap(prefill(target, history, [1, 2, 3]), history)
    assert result.stopped and result.committed == () and history == [1, 2, 3]
    with pytest.raises(InvalidDecodeState):
        decoder.step(history)


@pytest.mark.parametrize("options", [dict(min_draft=0), dict(min_draft=5, max_draft=4), dict(topk_feedback=-1)])
def test_invalid_options_are_refused(options):
    with pytest.raises(InvalidSpeculationConfig):
        SpecOptions(**options)


def test_a_topk_source_needs_topk_feedback():
    with pytest.raises(InvalidSpeculationConfig, match="top-K"):
        SpeculativeDecoder(FakeTarget(MODEL), Sampler(), SpeculationIndex(MODEL.vocab), vocab_size=MODEL.vocab,
                           options=SpecOptions(topk_feedback=0))


class ForcedOne(Oracle):
    """Oracle drafts of one token, marked forced (a grammar's single-token span)."""
    last_forced = True

    def suggest(self, context, budget):
        return super().suggest(context, budget)[:1]


@pytest.mark.parametrize("forced", [True, False])
def test_a_forced_one_token_draft_is_verified_and_an_unforced_one_is_not(forced):
    plain = plain_run(MODEL, Sampler(CONFIGS["sampled"]), PROMPTS)
    source = ForcedOne(plain.sampled)
    source.last_forced = forced
    spec, decoder = spec_run(MODEL, Sampler(CONFIGS["sampled"]), PROMPTS, source_decoder(source),
                             on_turn=source.start_turn)
    assert_same(plain, spec)
    s = decoder.stats
    if forced:
        assert s.accepted > 0 and s.spec_steps > 10 * s.fallback_steps  # fallbacks: a budget under 2 at a turn's end
    else:
        assert s.spec_steps == 0 and s.drafted == 0 and s.fallback_steps > 0
