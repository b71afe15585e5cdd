"""The row-wise contract, asserted: m token rows in one call give, bit for bit, the logits and KV rows of
feeding the tokens one at a time (tests/engine/test_row_wise.py for the dense families, test_moe.py and
test_deepseek2.py for the experts' ones); so a batched decode step is each conversation's step alone, and
speculative decoding yields the plain ids."""

import numpy as np

ROW_COUNTS = (1, 2, 5, 8, 17, 33)  # one call of each size, in turn, after a short prefilled prompt
PROMPT = [3, 17, 59, 5]


def random_tokens(vocab: int, n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


def assert_rows_equal_one_at_a_time(model, kv="f16", row_counts=ROW_COUNTS, prompt=PROMPT):
    tokens = random_tokens(model.vocab_size, sum(row_counts))
    capacity = len(prompt) + len(tokens)
    one, rows = model.new_cache(capacity, kv), model.new_cache(capacity, kv)
    np.testing.assert_array_equal(model.forward(prompt, one), model.forward(prompt, rows))
    singles = np.stack([model.forward([t], one) for t in tokens])
    start = 0
    for m in row_counts:
        np.testing.assert_array_equal(model.forward_rows(tokens[start : start + m], rows), singles[start : start + m],
                                      err_msg=f"{m} rows in one call")
        start += m
    assert one.len == rows.len == capacity
    for a, b in zip(one.k + one.v, rows.k + rows.v):
        np.testing.assert_array_equal(a, b)


def assert_decode_equals_rows_past_a_prefill_chunk(model):
    """Teacher-forced decode (one token a call) gives the bytes of the rows path, over more than a prefill chunk."""
    from engine import generate
    from engine.models.model import UBATCH

    ids = random_tokens(model.vocab_size, UBATCH + 40, seed=5)
    rows = np.concatenate(list(generate.teacher_forced(model, ids, path="rows")))
    decode = np.concatenate(list(generate.teacher_forced(model, ids, path="decode")))
    np.testing.assert_array_equal(decode, rows)


def assert_same_cache(a, b):
    """Two caches hold the same positions, bit for bit, and the same recurrent state (a hybrid's)."""
    assert a.len == b.len
    for x, y in zip(a.k + a.v, b.k + b.v):
        np.testing.assert_array_equal(x[: a.len], y[: a.len])
    assert a.state_shapes == b.state_shapes
    for layer in range(len(a.state_shapes)):
        for x, y in zip(a.state_store.read(layer), b.state_store.read(layer)):
            np.testing.assert_array_equal(x, y)


def assert_batched_step_equals_each_alone(model, prompts, step):
    """One decode step of several conversations (the tokens `step`, after `prompts`) in one call."""
    alone, batched = [model.new_cache(16) for _ in prompts], [model.new_cache(16) for _ in prompts]
    for p, a, b in zip(prompts, alone, batched):
        model.forward(p, a)
        model.forward(p, b)
    expected = np.stack([model.forward([t], c) for t, c in zip(step, alone)])
    np.testing.assert_array_equal(model.decode_batch(step, batched), expected)


def assert_speculative_yields_the_plain_ids(model, prompt, config, monkeypatch, n=40):
    """Speculative decoding, its drafts always worth verifying, samples what plain decoding samples; its Stats."""
    from engine import generate
    from engine.sampling import Sampler
    from engine.speculative import Stats, stream

    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: 1.0 for m in range(1, 18)})  # drafts pay
    plain = list(generate.sample(model, prompt, n, Sampler(config)))
    stats = Stats()
    assert list(generate.sample_speculative(model, prompt, n, Sampler(config), stats=stats)) == plain
    assert stats.spec_steps > 0
    return stats
