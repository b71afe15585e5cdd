"""GLM-4.5's next-token-prediction (MTP) layer as a draft source, on tiny glm4moe models with one (tests/moe_models.py):
loaded beside the model without changing its forward, joined as the reference implementations join it, drafting
what it predicts, and never changing what is sampled (speculative == plain, bitwise, alone and in the cascade).

Two models: the random one (its layer's drafts are almost always wrong: the rejecting path and the cost gate),
and an "echo" one whose every layer adds nothing, so the model predicts a fixed permutation of its input token
and its next-token layer, fed the token after, predicts the permutation of that one: right every time, so the
accepting path and the chained drafts run."""

import gguf
import numpy as np
import pytest

from engine import generate
from engine.models import load_model
from engine.sampling import Sampler, SamplerConfig
from engine.speculative import Stats, stream
from engine.speculative.decoder import SpecOptions, SpeculativeDecoder
from engine.speculative.next_token import NextTokenDrafts
from engine.speculative.target import CacheTarget
from tests.moe_models import TOKENS, write_glm4moe_model
from tests.synthetic import CHATML_TOKENS

N_EMBD, MTP = 256, "blk.3."
VOCAB = len(CHATML_TOKENS)
PROMPT = TOKENS[:12]
CONFIGS = [SamplerConfig(), SamplerConfig(temperature=0.8, top_k=20, seed=3)]
# the layers of the model and of the next-token layer add nothing: their output matrices are zero
SILENT = {f"blk.{i}.{t}.weight": 0.0 for i in range(4) for t in ("attn_output", "ffn_down_exps", "ffn_down_shexp")}
SILENT["blk.0.ffn_down.weight"] = 0.0


def _echo_fill() -> dict:
    rng = np.random.default_rng(11)
    embedding = rng.normal(0, 0.5, (VOCAB, N_EMBD))
    permutation = rng.permutation(VOCAB)
    join = np.hstack([np.eye(N_EMBD), np.zeros((N_EMBD, N_EMBD))])  # the layer reads the embedding half
    return SILENT | {"token_embd.weight": embedding, "output.weight": embedding[permutation],
                     "output_norm.weight": 1.0, MTP + "nextn.enorm.weight": 1.0,
                     MTP + "nextn.shared_head_norm.weight": 1.0, MTP + "nextn.eh_proj.weight": join}


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("mtp") / "random.gguf"
    write_glm4moe_model(path, next_token=True)
    return load_model(path)


@pytest.fixture(scope="module")
def echo_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("mtp") / "echo.gguf"
    # its own embedding and head left out: the layer reads the model's
    write_glm4moe_model(path, next_token=True, tied=False, fill=_echo_fill(),
                        skip_tensors=(MTP + "nextn.embed_tokens.weight", MTP + "nextn.shared_head_head.weight"))
    return load_model(path)


def test_the_layer_is_loaded_and_the_forward_is_the_model_without_it(random_model, tmp_path):
    trunk = tmp_path / "trunk.gguf"
    write_glm4moe_model(trunk)
    plain = load_model(trunk)
    assert random_model.n_layers == plain.n_layers == 3
    assert random_model.next_token is not None and plain.next_token is None
    np.testing.assert_array_equal(random_model.forward_all(TOKENS[:8], random_model.new_cache(8)),
                                  plain.forward_all(TOKENS[:8], plain.new_cache(8)))


def test_a_layer_the_file_holds_only_part_of_is_left_out_with_a_warning(tmp_path):
    path = tmp_path / "part.gguf"
    write_glm4moe_model(path, next_token=True, skip_tensors=(MTP + "nextn.hnorm.weight",))
    with pytest.warns(RuntimeWarning, match="blk.3 lacks blk.3.nextn.hnorm.weight"):
        model = load_model(path)
    assert model.next_token is None
    assert model.forward(TOKENS[:4], model.new_cache(4)).shape == (model.vocab_size,)


def _rms(x, w, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def test_the_layer_joins_the_embedding_and_the_hidden_state_as_the_reference_implementations_do(tmp_path):
    """With its decoder layer adding nothing, the layer is its joining alone: the token's embedding (zero at
    position 0) and the hidden state, each through its norm, [embedding, hidden] through eh_proj, then its norm
    and head; written out here in NumPy from the file's F32 tensors."""
    path = tmp_path / "joined.gguf"
    write_glm4moe_model(path, next_token=True, fill={k: v for k, v in SILENT.items() if k.startswith(MTP)})
    tensors = {t.name: np.array(t.data, np.float64) for t in gguf.GGUFReader(path).tensors}
    w = {k.removeprefix(MTP + "nextn."): v for k, v in tensors.items() if k.startswith(MTP + "nextn.")}
    predictor = load_model(path).next_token
    rng = np.random.default_rng(5)
    nexts, hidden = TOKENS[:6], rng.normal(0, 1, (6, N_EMBD)).astype(np.float32)
    states = predictor.forward(nexts, hidden, predictor.new_cache(8), first_is_position_0=True)
    logits = predictor.logits(states)

    embedding = w["embed_tokens.weight"][nexts]
    embedding[0] = 0.0
    joined = np.hstack([_rms(embedding, w["enorm.weight"]), _rms(hidden.astype(np.float64), w["hnorm.weight"])])
    expected_states = joined @ w["eh_proj.weight"].T
    expected = _rms(expected_states, w["shared_head_norm.weight"]) @ w["shared_head_head.weight"].T
    np.testing.assert_allclose(states, expected_states, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(logits, expected, rtol=1e-3, atol=1e-3)


def speculate_with_the_layer(model, prompt, n, config, source_of=None):
    """Decode n tokens with the decoder drafting from the model's next-token layer alone (no cost gate: every
    step drafts); the ids and the decoder's statistics."""
    cache = model.new_cache(len(prompt) + n + 1)
    source = NextTokenDrafts(model.next_token)
    source.follow(cache)
    decoder = SpeculativeDecoder(CacheTarget(model, cache), Sampler(config), source, vocab_size=model.vocab_size,
                                 options=SpecOptions(max_draft=3, min_draft=1))
    history = list(prompt)
    ids = list(decoder.bootstrap(model.forward(prompt, cache), history).committed)
    while len(ids) < n:
        ids += decoder.step(history, limit=n - len(ids)).committed
    return ids, decoder.stats


@pytest.mark.parametrize("config", CONFIGS, ids=["greedy", "seeded"])
@pytest.mark.parametrize("which", ["random_model", "echo_model"])
def test_drafts_of_the_next_token_layer_yield_the_plain_ids(which, config, request):
    model = request.getfixturevalue(which)
    plain = list(generate.sample(model, PROMPT, 30, Sampler(config)))
    ids, stats = speculate_with_the_layer(model, PROMPT, 30, config)
    assert ids == plain
    # every step after the first token verified a draft, but a last one with room for one token only
    assert stats.spec_steps + stats.fallback_steps == stats.steps - 1 and stats.fallback_steps <= 1


LONG_PROMPT = (TOKENS * 3)[:90]  # more rows than the layer reads in one call


@pytest.mark.parametrize("which", ["random_model", "echo_model"])
def test_after_a_long_prompt_the_ids_stay_plain_and_the_drafts_right(which, request):
    model = request.getfixturevalue(which)
    plain = list(generate.sample(model, LONG_PROMPT, 20, Sampler()))
    ids, stats = speculate_with_the_layer(model, LONG_PROMPT, 20, SamplerConfig())
    assert ids == plain
    assert which == "random_model" or stats.acceptance_rate() == 1.0


def test_a_long_prompt_is_read_at_the_first_draft_not_before_the_first_token(random_model):
    model = random_model
    cache = model.new_cache(len(LONG_PROMPT) + 8)
    source = NextTokenDrafts(model.next_token)
    source.follow(cache)
    decoder = SpeculativeDecoder(CacheTarget(model, cache), Sampler(), source, vocab_size=model.vocab_size,
                                 options=SpecOptions(max_draft=3, min_draft=1))
    history = list(LONG_PROMPT)
    decoder.bootstrap(model.forward(LONG_PROMPT, cache), history)
    assert len(source.positions_read) == 0  # the first token comes out without waiting for the layer
    decoder.step(history)
    assert source.positions_read.start == 0 and source.positions_read.stop >= len(LONG_PROMPT)
    assert decoder.stats.spec_steps == 1


def test_the_echo_models_layer_drafts_what_the_model_then_samples(echo_model):
    ids, stats = speculate_with_the_layer(echo_model, PROMPT, 40, SamplerConfig())
    assert len(set(ids)) > 10  # the permutation's orbit, not one repeated token
    assert stats.acceptance_rate() == 1.0 and stats.drafted >= 3 * (stats.spec_steps - 1)
    assert stats.tokens_per_step() > 3.0


@pytest.mark.parametrize("config", CONFIGS, ids=["greedy", "seeded"])
@pytest.mark.parametrize("which", ["random_model", "echo_model"])
def test_the_cascade_with_the_next_token_layer_yields_the_plain_ids(which, config, request, monkeypatch):
    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: 1.0 for m in range(1, 18)})  # drafts pay
    model = request.getfixturevalue(which)
    plain = list(generate.sample(model, PROMPT, 40, Sampler(config)))
    stats = Stats()
    assert list(generate.sample_speculative(model, PROMPT, 40, Sampler(config), stats=stats)) == plain
    assert stats.spec_steps > 0


def test_in_the_cascade_the_layer_drafts_where_no_match_does(echo_model, monkeypatch):
    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: 1.0 for m in range(1, 18)})
    spec = stream.SpeculativeStream(echo_model)
    cache = echo_model.new_cache(64)
    history = list(PROMPT)
    decoder = spec.decoder(cache, Sampler())
    decoder.bootstrap(echo_model.forward(PROMPT, cache), history)
    for _ in range(6):
        decoder.step(history)
    layer = next(s for s in spec.index.source_stats() if s.name == "next-token layer")
    assert layer.drafted > 0 and layer.accepted == layer.drafted


def _suggest_after_each(model, cache, source, steps):
    """Feed `steps` (lists of tokens) one call each, asking the source for a draft after each (its context:
    the tokens fed and the next one, which the next call feeds first)."""
    fed = []
    for i, tokens in enumerate(steps):
        model.forward_rows(tokens, cache)
        fed += tokens
        upcoming = steps[i + 1][0] if i + 1 < len(steps) else 7
        draft = source.suggest(fed + [upcoming], 3)
    return draft, source


def test_rows_the_model_feeds_again_replace_the_layers_rows_from_there(random_model):
    """A rewind (rejected rows, an edit) then new rows: the drafts are those of a source that never saw the rows
    written over; and a row's bits do not depend on which call fed it (drafts asked for or not)."""
    model = random_model
    x, y = TOKENS[12:17], TOKENS[20:26]
    rewound, fresh = model.new_cache(40), model.new_cache(40)
    a, b = NextTokenDrafts(model.next_token), NextTokenDrafts(model.next_token)
    a.follow(rewound)
    b.follow(fresh)
    model.forward(PROMPT, rewound)
    model.forward(PROMPT, fresh)
    _suggest_after_each(model, rewound, a, [[t] for t in x])
    rewound.truncate(len(PROMPT) + 2)  # keeps x[0], x[1]; x[2] is fed again, then y
    draft_a, _ = _suggest_after_each(model, rewound, a, [[x[2]], *([t] for t in y)])
    model.forward_rows(x[:2], fresh)  # two rows in one call, and no draft asked for before the end
    draft_b, _ = _suggest_after_each(model, fresh, b, [[x[2]], y[:3], y[3:]])
    assert draft_a == draft_b
    np.testing.assert_array_equal(a._last_state, b._last_state)


def test_the_speculation_benchmark_measures_the_layer_beside_the_cascade_alone(echo_model, monkeypatch):
    from engine.benchmarks.speculation import Workload, run_workload

    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: 1.0 for m in range(1, 18)})
    r = run_workload(echo_model, Workload("echo", ("say abc", "again: {previous}"), max_tokens=24), 1)
    run = r["per_run"][0]
    assert r["identical"] and run["layer_drafted"] > 0 and run["layer_accepted"] == run["layer_drafted"]
    assert run["tokens_per_step"] > run["cascade_tokens_per_step"]  # the layer drafts what no n-gram can
    assert r["layer_ms_per_token"]["median"] > 0 and r["cascade_tps"]["median"] > 0


def test_the_layer_s_experts_stream_with_the_model_s_and_draft_the_mapped_bits(tmp_path):
    from engine.models.expert_store import StreamOptions

    path = tmp_path / "streamed.gguf"
    write_glm4moe_model(path, next_token=True)
    hidden = np.random.default_rng(5).normal(0, 1, (6, N_EMBD)).astype(np.float32)
    logits = []
    for experts in (None, StreamOptions(cache_bytes=1)):  # one expert a layer at a time
        model = load_model(path, experts=experts)
        predictor = model.next_token
        logits.append(predictor.logits(predictor.forward(TOKENS[:6], hidden, predictor.new_cache(8))))
    np.testing.assert_array_equal(logits[1], logits[0])
    assert model.expert_store.usage[3].sum() == 6 * 2  # the layer's 6 rows, each routed to 2 experts read from disk
