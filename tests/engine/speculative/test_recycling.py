import pytest

from engine.errors import InvalidSpeculationConfig
from engine.speculative.recycling import TokenRecycling
from engine.speculative.source import TopKRow


def test_spec_example_top1_chain_drafting():
    rec = TokenRecycling(32)  # K = 8
    rec.update(3, [7, 9])
    rec.update(7, [5])
    assert rec.draft_chain(3, 4) == [7, 5]  # 3 -> 7 -> 5, then row 5 is unseen


def test_chain_stops_at_the_budget_and_may_cycle():
    rec = TokenRecycling(8)
    rec.update(1, [2])
    rec.update(2, [1])
    assert rec.draft_chain(1, 5) == [2, 1, 2, 1, 2]
    assert rec.draft_chain(1, 0) == []


def test_update_keeps_k_best_and_drops_out_of_vocab():
    rec = TokenRecycling(16, k=3)
    rec.update(4, [9, 99, 8, 7, 6])
    assert rec.topk_of(4) == [9, 8, 7]
    rec.update(4, [5])  # a whole-row overwrite, not a merge
    assert rec.topk_of(4) == [5]
    rec.update(99, [1])  # out-of-vocabulary rows are ignored
    assert rec.draft_chain(99, 3) == []


def test_committed_bigrams_are_promoted_to_slot_zero():
    rec = TokenRecycling(16, k=4)
    rec.update(1, [5, 6, 7, 8])
    rec.observe([1, 7])  # 7 was third: moves to the front, the others shift
    assert rec.topk_of(1) == [7, 5, 6, 8]
    rec.observe([1, 2])  # the bigram (7, 1) is promoted too; 2 is new for row 1: the last slot is evicted
    assert rec.topk_of(1) == [2, 7, 5, 6]
    assert rec.topk_of(7) == [1]
    rec.observe([3])  # the bigram spans observe calls: (2, 3)
    assert rec.topk_of(2) == [3]


def test_feedback_then_commit_lets_ground_truth_win():
    rec = TokenRecycling(16)
    rec.observe_top_k([TopKRow(4, (9, 10)), TopKRow(9, (11,))])
    rec.observe([4, 10])
    assert rec.suggest([4], 3) == [10]  # row 10 is unseen
    assert rec.draft_chain(9, 2) == [11]


def test_invalid_geometry_is_refused():
    with pytest.raises(InvalidSpeculationConfig):
        TokenRecycling(0)
