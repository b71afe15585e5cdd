"""The row-wise contract, asserted: m token rows in one call give, bit for bit, the logits and KV rows of
feeding the tokens one at a time (tests/engine/test_row_wise.py for the dense families, test_moe.py for the
experts' ones)."""

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
