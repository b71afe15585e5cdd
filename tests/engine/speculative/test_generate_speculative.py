"""engine.generate.sample_speculative yields exactly what the plain sample loop yields."""

import pytest

from engine import generate
from engine.sampling import Sampler, SamplerConfig
from engine.speculative import Stats, stream


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from engine.models import load_model
    from tests.synthetic import write_tiny_model

    path = tmp_path_factory.mktemp("generate") / "tiny.gguf"
    write_tiny_model(path, "llama", vocab=64)
    return load_model(path)


@pytest.fixture(autouse=True)
def free_verify(monkeypatch):
    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: 1.0 for m in range(1, 18)})


PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]


@pytest.mark.parametrize("config", [SamplerConfig(), SamplerConfig(temperature=0.8, top_k=20, top_p=0.9,
                                                                   min_p=0.05, repeat_penalty=1.1, seed=3)])
@pytest.mark.parametrize("max_tokens, capacity", [(0, None), (1, None), (7, None), (60, None), (60, len(PROMPT) + 9)])
def test_speculative_generation_yields_the_plain_ids(tiny_model, config, max_tokens, capacity):
    plain = list(generate.sample(tiny_model, PROMPT, max_tokens, Sampler(config), capacity=capacity))
    stats = Stats()
    spec = list(generate.sample_speculative(tiny_model, PROMPT, max_tokens, Sampler(config), capacity=capacity,
                                            stats=stats))
    assert spec == plain
    assert stats.committed == len(spec)
    assert stats.spec_steps > 0 or max_tokens < 60  # a long run verified drafts: the decoder did its job


def test_a_stop_id_ends_speculative_generation_like_plain(tiny_model):
    greedy = list(generate.sample(tiny_model, PROMPT, 40, Sampler()))
    stop = greedy[len(greedy) // 2]
    plain = list(generate.sample(tiny_model, PROMPT, 40, Sampler(), stop_ids=[stop]))
    assert plain[-1] == stop and len(plain) < len(greedy)
    assert list(generate.sample_speculative(tiny_model, PROMPT, 40, Sampler(), stop_ids=[stop])) == plain


@pytest.mark.parametrize("seed", [None, 5])
def test_a_grammar_drafts_its_forced_spans_and_yields_the_plain_ids(tiny_chat, seed):
    from engine.sampling.grammar import Grammar, grammar_processor

    model, tok = tiny_chat
    grammar = Grammar("regex", "(hello|help) world: [0-9]{1,3}, one two three")
    config = SamplerConfig() if seed is None else SamplerConfig(temperature=1.0, seed=seed)
    prompt = tok.encode("xyz", add_special=False)
    stops = [tok.eos_id]
    plain = list(generate.sample(model, prompt, 60, Sampler(config, grammar_processor(grammar, tok)), stops))
    stats = Stats()
    spec = list(generate.sample_speculative(model, prompt, 60, Sampler(config, grammar_processor(grammar, tok)),
                                            stops, stats=stats))
    assert spec == plain and plain[-1] == tok.eos_id
    assert stats.accepted >= len(" world: ") + len(", one two three") - 2  # the forced spans, verified whole
