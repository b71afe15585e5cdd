import numpy as np

from engine.kv.cache import KvCache
from engine.sampling.sampler import Sampler, SamplerConfig
from engine.speculative.cascade import SpeculationIndex
from engine.speculative.decoder import SpecOptions, SpeculativeDecoder
from engine.speculative.target import CacheTarget
from tests.engine.speculative.fakes import STOP, FakeModel
from tests.kv_rows import append_layer


class RowWiseModel:
    """A model over a real KvCache: each position's K row stores its token, and the logits read the whole
    cache back, so rows the decoder failed to rewind would change them."""

    def __init__(self):
        self.fake = FakeModel()

    def forward_rows(self, tokens, cache: KvCache) -> np.ndarray:
        rows = []
        for t in tokens:
            k = np.full((1, 1, 2), float(t), dtype=np.float32)
            append_layer(cache, 0, k, k)
            cache.advance(1)
            held = cache.k[0][: cache.len, 0, 0].view(np.float16).astype(np.int64)
            rows.append(self.fake.logits(held.tolist()))
        return np.stack(rows)


def test_cache_target_drives_a_kv_cache_losslessly():
    model, config, prompt = RowWiseModel(), SamplerConfig(temperature=0.8, top_k=10, seed=4), [1, 2, 3, 4, 1, 2, 3]

    plain_cache, sampler, history = KvCache.uniform(1, 1, 2, 64), Sampler(config), list(prompt)
    logits = model.forward_rows(prompt, plain_cache)[-1]
    while len(history) < 60:
        token = sampler.sample(logits, history)
        if token == STOP:
            break
        history.append(token)
        logits = model.forward_rows([token], plain_cache)[-1]

    cache = KvCache.uniform(1, 1, 2, 64)
    target = CacheTarget(model, cache)
    assert target.capacity == 64
    spec_history = list(prompt)
    decoder = SpeculativeDecoder(target, Sampler(config), SpeculationIndex(48), vocab_size=48,
                                 options=SpecOptions(stop_tokens=frozenset({STOP})))
    decoder.source.sync(spec_history)
    result = decoder.bootstrap(model.forward_rows(prompt, cache)[-1], spec_history)
    while not result.stopped and len(spec_history) < 60:
        result = decoder.step(spec_history, limit=60 - len(spec_history))
        assert len(target) == cache.len == len(spec_history) - (not result.stopped)
    assert spec_history == history and len(history) > 50  # a long reply that ended on its stop token
    assert decoder.stats.accepted > 0
