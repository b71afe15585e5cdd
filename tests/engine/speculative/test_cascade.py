import pytest

from engine.errors import InvalidSpeculationConfig, SamIndexError
from engine.speculative.cascade import AcceptanceGate, SpeculationIndex
from engine.speculative.source import TopKRow, wants_top_k

LONG = list(range(20, 40))  # a continuation longer than any budget in these tests


def stats(index):
    return {s.name: s for s in index.source_stats()}


def test_spec_example_observe_then_suggest():
    index = SpeculationIndex(1024)
    index.observe([1, 2, 3, 4, 1, 2])
    draft = index.suggest([1, 2, 3, 4, 1, 2], 16)
    assert len(draft) >= 2 and draft[:2] == [3, 4]
    index.add_reference([7, 8, 9, 10])
    assert wants_top_k(index)  # the recycling matrix consumes the verify feedback


def test_budget_is_min_of_budget_and_beta_times_one_plus_match():
    index = SpeculationIndex(1024, beta=2)
    index.observe([1, 2, *LONG, 1, 2])
    assert index.suggest([], 16) == LONG[:6]  # match 2: 2 * (1 + 2)
    assert index.suggest([], 4) == LONG[:4]
    index.observe([20])
    assert index.suggest([], 16) == LONG[1:9]  # match 3: 2 * (1 + 3)


def test_longest_match_wins_and_ties_go_to_the_conversation_then_the_first_reference():
    index = SpeculationIndex(1024)
    index.observe([1, 2, 50, 51, 52, 53, 1, 2])  # conversation match [1, 2]
    index.add_reference([9, 1, 2, 60, 61, 62, 63])  # also [1, 2]: a tie
    assert index.suggest([], 4) == [50, 51, 52, 53]
    index.add_reference([53, 1, 2, 70, 71, 72, 73])  # [53, 1, 2]: longer, wins
    index.add_reference([53, 1, 2, 80, 81, 82, 83])  # as long, added later: loses the tie
    assert index.suggest([], 4) == [70, 71, 72, 73]


def test_reference_ties_go_to_the_first_added():
    index = SpeculationIndex(1024)
    index.observe([5, 1, 2])  # no conversation match
    index.add_reference([1, 2, 60, 61])
    index.add_reference([1, 2, 70, 71])
    assert index.suggest([], 8) == [60, 61]


def test_a_reference_added_mid_conversation_catches_up_over_the_stream():
    index = SpeculationIndex(1024)
    index.observe([40, 41, 42, 43])
    index.add_reference([100, 42, 43, 44, 45, 46])
    assert index.suggest([], 3) == [44, 45, 46]  # matched [42, 43] observed before the reference existed
    index.observe([44, 99])
    assert index.suggest([], 3) == []  # [99] matches nothing; recycling knows nothing after 99
    index.clear_references()
    index.observe([42, 43])  # the conversation itself now has [42, 43] earlier
    assert index.suggest([], 2) == [44, 99]


def test_short_matches_fall_back_to_recycling():
    index = SpeculationIndex(64, recycling_chain=3)
    index.observe_top_k([TopKRow(7, (8, 1)), TopKRow(8, (9,)), TopKRow(9, (10,)), TopKRow(10, (11,))])
    index.observe([3, 7])
    assert index.suggest([3, 7], 16) == [8, 9, 10]  # chain capped at recycling_chain
    assert index.suggest([3, 7], 2) == [8, 9]


def test_bad_reference_tokens_add_nothing():
    index = SpeculationIndex(64)
    with pytest.raises(SamIndexError):
        index.add_reference([1, -2])
    assert index.references == []


def drive_rejections(index, rounds, first_fresh):
    """Each round: suggest, then commit a token never seen before and [1, 2], so the conversation keeps a
    [1, 2] match whose draft is rejected at its first token."""
    for r in range(rounds):
        index.suggest([], 16)
        index.observe([first_fresh + r, 1, 2])


def test_a_poor_source_is_muted_then_reprobed_and_keeps_observing():
    index = SpeculationIndex(1024, mute_commits=128, gate_window=64)
    index.observe([1, 2, 3, 1, 2])
    rounds = 0
    while not index.conversation_gate.muted:
        drive_rejections(index, 1, 100 + rounds)
        rounds += 1
        assert rounds < 40
    conv = stats(index)["conversation"]
    assert conv.mutes == 1 and conv.drafted >= 64 and conv.accepted == 0
    tokens_at_mute = index.conversation.token_count()
    assert index.conversation.match_len() >= 2
    draft = index.suggest([2], 16)  # muted: the recycling fallback speaks instead
    assert draft == index.recycling.draft_chain(2, 8)
    index.observe([500, 1, 2])
    assert index.conversation.token_count() == tokens_at_mute + 3  # a muted source still observes
    for r in range(40):  # 3 + 40 * 3 = 123 commits: still muted
        index.observe([600 + r, 1, 2])
    assert index.conversation_gate.muted
    index.observe([700, 1, 2])  # 126
    assert index.conversation_gate.muted
    index.observe([701, 1])  # 128: re-probed with a fresh window
    assert not index.conversation_gate.muted
    index.observe([2])
    assert index.suggest([], 3) == [701, 1, 2]  # the conversation drafts again, from the whole stream


def test_acceptance_is_settled_on_the_verified_prefix():
    index = SpeculationIndex(1024)
    index.observe([1, 2, *LONG, 1, 2])
    assert len(index.suggest([], 6)) == 6
    index.truncate_pending(3)  # the decoder verifies only 3
    index.observe(LONG[:2] + [99])
    conv = stats(index)["conversation"]
    assert (conv.drafted, conv.accepted) == (3, 2)
    index.suggest([], 1)  # a 1-token draft is below accounting_min_draft: never verified, never counted
    index.observe([5])
    assert stats(index)["conversation"].drafted == 3


def test_sync_extends_or_rebuilds():
    index = SpeculationIndex(1024)
    index.observe([1, 2, 3])
    index.sync([1, 2, 3, 4, 1, 2])
    assert index.conversation.tokens == [1, 2, 3, 4, 1, 2]
    assert index.suggest([], 2) == [3, 4]
    index.sync([1, 2, 9, 1, 2])  # an edited history: rebuilt from the context
    assert index.conversation.tokens == [1, 2, 9, 1, 2]
    assert index.suggest([], 2) == [9, 1]


def test_acceptance_gate_rolling_window():
    gate = AcceptanceGate(window=10, mute_below=0.2, mute_commits=5)
    gate.record(8, 1)
    assert not gate.muted and gate.rate() == 1 / 8  # not judged before the window is full
    gate.record(4, 4)  # 12 bits: the window keeps the last 10, the first hit scrolled out
    assert not gate.muted and gate.rate() == pytest.approx(4 / 10)
    gate.record(10, 1)
    assert gate.muted
    gate.tick(4)
    assert gate.muted
    gate.tick(1)
    assert not gate.muted and gate.rate() is None


def test_invalid_policy_is_refused():
    with pytest.raises(InvalidSpeculationConfig):
        SpeculationIndex(64, beta=0)


def test_match_len_is_the_longest_match_of_a_source_that_may_draft():
    index = SpeculationIndex(1024)
    assert index.match_len() == 0
    index.observe([1, 2, 3, 4, 9, 1, 2, 3])
    assert index.match_len() == 3 == index.conversation.match_len()
    index.add_reference([5, 1, 2, 3, 4, 6])  # the document matches [1, 2, 3] too, and later [.., 4]
    index.observe([4])
    assert index.match_len() == 4
    index.conversation_gate._muted_left = 1  # a muted conversation does not vouch for a draft
    assert index.match_len() == index.references[0].source.match_len() == 4
