import pytest

from engine.errors import InvalidSpeculationConfig
from engine.speculative.gate import CostGate, measure_verify_costs, table_cost

# verify over m rows costs 1 + 0.1 (m - 1) plain steps: cheap extra rows, like a bandwidth-bound decode
CHEAP = {m: 0.010 * (1 + 0.1 * (m - 1)) for m in range(1, 18)}


def test_table_cost_interpolates_and_extends():
    assert table_cost({1: 1.0, 3: 2.0}, 2) == pytest.approx(1.5)
    assert table_cost({1: 1.0, 3: 2.0}, 5) == pytest.approx(3.0)
    assert table_cost({1: 2.0}, 4) == pytest.approx(8.0)


def test_gate_turns_off_below_one_and_reprobes_with_backoff():
    gate = CostGate(CHEAP, reprobe_after=8, reprobe_max=32, probe_steps=2, rate_window=4, min_window_drafted=8)
    assert gate.allow() and gate.state == "on"
    for _ in range(2):  # 4-token drafts, nothing accepted: 1 token per 1.4 plain steps
        gate.record_step(rows=5, produced=1, drafted=4, accepted=0)
    assert gate.state == "off" and gate.est_speedup() is None  # judged at 8 drafted tokens, then cleared
    for off_wait in (8, 16, 32, 32):
        assert [gate.allow() for _ in range(off_wait)] == [False] * off_wait
        assert gate.allow() and gate.state == "probe"
        for _ in range(2):
            gate.record_step(rows=5, produced=1, drafted=4, accepted=0)
        assert gate.state == "off"
    assert [gate.allow() for _ in range(32)] == [False] * 32
    assert gate.allow()
    gate.record_step(rows=5, produced=5, drafted=4, accepted=4)
    gate.record_step(rows=5, produced=5, drafted=4, accepted=4)
    assert gate.state == "on"
    gate.record_step(rows=5, produced=1, drafted=4, accepted=0)
    gate.record_step(rows=5, produced=1, drafted=4, accepted=0)
    assert gate.state == "on"  # the rolling window still holds the probe's good steps: 12 / 5.6
    gate.record_step(rows=5, produced=1, drafted=4, accepted=0)  # 8 / 5.6
    gate.record_step(rows=5, produced=1, drafted=4, accepted=0)  # 4 / 5.6: off again,
    assert gate.state == "off"  # and the backoff starts again from reprobe_after
    assert [gate.allow() for _ in range(8)] == [False] * 8 and gate.allow()


def test_probe_needs_the_margin_to_turn_back_on():
    gate = CostGate({1: 1.0, 3: 2.0}, reprobe_after=1, probe_steps=1, probe_margin=0.10, min_window_drafted=1)
    gate.record_step(rows=3, produced=1, drafted=2, accepted=0)  # 0.5: off
    assert gate.state == "off"
    assert not gate.allow() and gate.allow()
    gate.record_step(rows=3, produced=2, drafted=2, accepted=1)  # 1.0: not above 1.1, stays off
    assert gate.state == "off"
    assert not gate.allow() and not gate.allow() and gate.allow()  # backoff doubled to 2
    gate.record_step(rows=3, produced=3, drafted=2, accepted=2)  # 1.5
    assert gate.state == "on"
    gate.record_step(rows=3, produced=2, drafted=2, accepted=1)  # 1.0 is not below 1.0: stays on
    assert gate.state == "on"


def test_budget_adapts_to_acceptance():
    gate = CostGate(CHEAP, min_window_drafted=8)
    assert gate.budget() == 3  # no evidence yet: a short first draft (a long miss would cost many rows)
    for _ in range(4):
        gate.record_step(rows=17, produced=17, drafted=16, accepted=16)
    assert gate.budget() == 16
    low = CostGate(CHEAP, min_window_drafted=8)
    for _ in range(4):
        low.record_step(rows=5, produced=2, drafted=4, accepted=1)
    assert low.budget() < 8  # 25% acceptance: longer drafts cost more than they return
    expensive = CostGate({m: float(m) for m in range(1, 18)}, min_window_drafted=8)
    for _ in range(4):
        expensive.record_step(rows=5, produced=4, drafted=4, accepted=3)
    assert expensive.budget() == 2  # every row costs a plain step: the shortest draft is the best bet


def test_measured_times_rescale_the_table_through_a_clamped_ewma():
    gate = CostGate({1: 1.0, 5: 2.0}, rescale_weight=0.5, rescale_clamp=(0.5, 2.0))
    assert gate.cost(5) == pytest.approx(2.0)
    gate.record_time(5, 4.0)  # twice the table: verify rows are dearer here
    assert gate.cost(5) == pytest.approx(4.0)
    gate.record_time(5, 100.0)  # an outlier is clamped to 2x, and only half-weighted
    assert gate.cost(5) == pytest.approx(4.0)
    gate.record_time(1, 2.0)  # the plain step slowed down too: the ratio is what counts
    assert gate.cost(5) == pytest.approx(2.0)
    gate.record_time(5, 0.1)  # a fast outlier is clamped to 0.5x: 2 + 0.5 * (0.5 - 2)
    assert gate.seconds(5) == pytest.approx(2.0 * 1.25)
    gate.record_time(3, 1.0)  # an entry between table points: its first measurement sets it
    assert gate.seconds(3) == pytest.approx(1.0)


def test_measure_verify_costs_times_every_row_count():
    calls, now = [], [0.0]

    def run_rows(m):
        calls.append(m)
        now[0] += 0.001 * m

    table = measure_verify_costs(run_rows, max_rows=4, repeats=2, clock=lambda: now[0])
    assert calls == [1, 1, 1, 2, 2, 3, 3, 4, 4]  # one warm-up, then `repeats` per row count
    assert table == pytest.approx({1: 0.001, 2: 0.002, 3: 0.003, 4: 0.004})


@pytest.mark.parametrize("table, options", [
    ({}, {}), ({2: 1.0}, {}), ({1: 0.0}, {}), ({1: 1.0}, {"probe_steps": 0}),
    ({1: 1.0}, {"rate_window": 0}), ({1: 1.0}, {"reprobe_after": 0}), ({1: 1.0}, {"min_draft": 20}),
])
def test_degenerate_configurations_are_refused(table, options):
    with pytest.raises(InvalidSpeculationConfig):
        CostGate(table, **options)


def test_a_confident_match_speculates_while_off_and_turns_the_gate_back_on_when_it_pays():
    gate = CostGate(CHEAP, reprobe_after=64, rate_window=4, min_window_drafted=8, confident_match=6)
    for _ in range(2):
        gate.record_step(rows=5, produced=1, drafted=4, accepted=0)
    assert gate.state == "off"
    assert not gate.allow(match=5)  # a short match waits out the backoff
    assert gate.allow(match=6) and gate.state == "off"  # a long one is a copy: it may speculate
    gate.record_step(rows=5, produced=1, drafted=4, accepted=0)  # a miss: still off, still counting down
    assert gate.state == "off" and not gate.allow(match=0)
    gate.record_step(rows=17, produced=17, drafted=16, accepted=16)  # 18 tokens / 4.1 plain steps
    assert gate.state == "on"
    assert gate.allow()


def test_a_confident_match_may_draft_as_long_as_it_is():
    gate = CostGate(CHEAP, min_window_drafted=8, confident_match=6, max_draft=16)
    assert gate.budget(match=5) == 3  # not confident: the first budget
    assert gate.budget(match=11) == 11
    assert gate.budget(match=40) == 16
    for _ in range(4):  # half the drafts accepted: short drafts pay best, unless a match vouches for more
        gate.record_step(rows=3, produced=2, drafted=2, accepted=1)
    assert gate.state == "on" and gate.budget() == 2 and gate.budget(match=9) == 9
