"""The cost gate (spec 13.9.1): when speculation pays, and how long a draft to ask for.

Its figure is the rolling true speedup: tokens produced per plain-step-equivalent of verify cost, over the
last rate_window verify steps. A verify over m rows costs cost_table[m] / cost_table[1] plain steps; the
table is measured on the machine (`measure_verify_costs`) and, when the decoder has a clock, each measured
verify rescales its entry through a clamped EWMA (a busy machine or a cold cache changes the economics).
Below min_speedup the gate turns speculation off for reprobe_after steps, then probes for probe_steps
verify steps: it turns back on only at min_speedup + probe_margin (hysteresis), otherwise the wait doubles
up to reprobe_max. While it is off, a step whose source matches the stream over at least confident_match
tokens still speculates (copying: a quoted passage, a file returned whole, text pasted back), and when such
steps pay over the window the gate turns back on: a reply that starts with nothing to copy must not sit out
the copy that follows. With adapt_budget, the draft budget is the length that maximizes the expected speedup
at the rolling acceptance rate; until the window knows that rate (a reply's start, a probe) it is
first_budget: a first miss of a long draft costs a verify of many rows, and one such miss alone would
fill the window and switch speculation off (measured: Qwen2.5's code edit sat 128 steps off, at 99%
acceptance, after one). Its default, 3, is a verify of 4 rows, which costs what one of 3 does (the row
kernels take input rows four at a time; measured on Qwen2.5 at 1,650 positions: 25.6 and 25.9 ms).

The gate decides WHEN speculation runs and how much is drafted, never WHAT is committed: output is
identical whatever it decides.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Mapping

from engine.errors import InvalidSpeculationConfig


def table_cost(table: Mapping[int, float], rows: int) -> float:
    """Seconds for a verify over `rows` rows: the entry, else linear between the nearest entries, else
    extended with the slope of the last two (proportional with a single entry)."""
    if rows in table:
        return table[rows]
    keys = sorted(table)
    below = [k for k in keys if k < rows]
    above = [k for k in keys if k > rows]
    if below and above:
        a, b = below[-1], above[0]
        return table[a] + (table[b] - table[a]) * (rows - a) / (b - a)
    if len(keys) == 1:
        return table[keys[0]] * rows / keys[0]
    a, b = (keys[-2], keys[-1]) if below else (keys[0], keys[1])
    slope = (table[b] - table[a]) / (b - a)
    return max(table[b if below else a] + slope * (rows - (b if below else a)), 1e-12)


def measure_verify_costs(run_rows: Callable[[int], None], *, max_rows: int = 17, repeats: int = 3,
                         clock: Callable[[], float] = time.perf_counter) -> dict[int, float]:
    """The verify-cost table of this machine: for m = 1..max_rows, the fastest of `repeats` timed calls of
    `run_rows(m)`, which must run one verify forward over m rows at the cache end and rewind the cache."""
    if max_rows < 1 or repeats < 1:
        raise InvalidSpeculationConfig(f"measure_verify_costs needs max_rows and repeats >= 1 "
                                       f"(got {max_rows}, {repeats})")
    run_rows(1)  # warm-up: first-call compilation and page faults are not verify cost
    table = {}
    for m in range(1, max_rows + 1):
        best = float("inf")
        for _ in range(repeats):
            start = clock()
            run_rows(m)
            best = min(best, clock() - start)
        table[m] = max(best, 1e-9)
    return table


class CostGate:
    ON, OFF, PROBE = "on", "off", "probe"

    def __init__(self, cost_table: Mapping[int, float], *, max_draft: int = 16, min_draft: int = 2,
                 rate_window: int = 16, min_window_drafted: int = 8, min_speedup: float = 1.0,
                 probe_margin: float = 0.10, reprobe_after: int = 64, reprobe_max: int = 1024,
                 probe_steps: int = 4, adapt_budget: bool = True, first_budget: int = 3, rescale_weight: float = 0.1,
                 rescale_clamp: tuple[float, float] = (0.5, 2.0), confident_match: int = 6):
        _check_table(cost_table)
        checks = [
            (1 <= min_draft <= max_draft, f"need 1 <= min_draft <= max_draft (got {min_draft}, {max_draft})"),
            (rate_window >= 1, f"rate_window must be >= 1, got {rate_window}"),
            (probe_steps >= 1, f"probe_steps must be >= 1, got {probe_steps}"),
            (first_budget >= 1, f"first_budget must be >= 1, got {first_budget}"),
            (1 <= reprobe_after <= reprobe_max,
             f"need 1 <= reprobe_after <= reprobe_max (got {reprobe_after}, {reprobe_max})"),
            (0 < rescale_weight <= 1, f"rescale_weight must be in (0, 1], got {rescale_weight}"),
            (0 < rescale_clamp[0] <= 1 <= rescale_clamp[1], f"rescale_clamp must bracket 1, got {rescale_clamp}"),
            (confident_match >= 1, f"confident_match must be >= 1, got {confident_match}"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidSpeculationConfig(f"cost gate: {message}")
        self.table = dict(cost_table)
        self.max_draft, self.min_draft = max_draft, min_draft
        self.min_window_drafted = min_window_drafted
        self.min_speedup, self.probe_margin = min_speedup, probe_margin
        self.reprobe_after, self.reprobe_max, self.probe_steps = reprobe_after, reprobe_max, probe_steps
        self.adapt_budget, self.first_budget = adapt_budget, first_budget
        self.rescale_weight, self.rescale_clamp = rescale_weight, rescale_clamp
        self.confident_match = confident_match
        self.state = self.ON
        # per verify step: tokens produced, plain-step cost, drafted, accepted
        self._window: deque[tuple[int, float, int, int]] = deque(maxlen=rate_window)
        self._scale: dict[int, float] = {}  # rows -> EWMA of measured / table seconds
        self._backoff = reprobe_after
        self._off_left = 0
        self._probe_left = 0

    # --- economics -------------------------------------------------------------------------------

    def seconds(self, rows: int) -> float:
        scale = self._scale.get(rows, self._scale.get(1, 1.0))
        return table_cost(self.table, rows) * scale

    def cost(self, rows: int) -> float:
        """Plain-step equivalents of a verify over `rows` rows."""
        return self.seconds(rows) / self.seconds(1)

    def record_time(self, rows: int, seconds: float) -> None:
        """A measured forward over `rows` rows (plain steps included) rescales that table entry."""
        if rows < 1 or not seconds > 0:
            return
        lo, hi = self.rescale_clamp
        ratio = min(max(seconds / table_cost(self.table, rows), lo), hi)
        old = self._scale.get(rows)
        self._scale[rows] = ratio if old is None else old + self.rescale_weight * (ratio - old)

    def _sums(self) -> tuple[int, float, int, int]:
        produced = sum(w[0] for w in self._window)
        cost = sum(w[1] for w in self._window)
        drafted = sum(w[2] for w in self._window)
        accepted = sum(w[3] for w in self._window)
        return produced, cost, drafted, accepted

    def est_speedup(self) -> float | None:
        """Rolling tokens per plain-step equivalent; None until the window holds min_window_drafted drafts."""
        produced, cost, drafted, _ = self._sums()
        return produced / cost if drafted >= self.min_window_drafted and cost > 0 else None

    def acceptance(self) -> float | None:
        _, _, drafted, accepted = self._sums()
        return accepted / drafted if drafted >= self.min_window_drafted else None

    def budget(self, match: int = 0) -> int:
        """The draft length with the best expected speedup at the rolling acceptance rate; a draft that follows
        a confident match (`match` tokens) may run as long as the match, up to max_draft."""
        if not self.adapt_budget:
            return self.max_draft
        trusted = min(self.max_draft, match) if match >= self.confident_match else 0
        a = self.acceptance()
        if a is None:
            return max(self.min_draft, min(self.max_draft, self.first_budget), trusted)
        best_k, best = self.min_draft, -1.0
        for k in range(self.min_draft, self.max_draft + 1):
            expected = k + 1 if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)  # i.i.d. per-token acceptance
            value = expected / self.cost(k + 1)
            if value > best:
                best_k, best = k, value
        return max(best_k, trusted)

    # --- the state machine -------------------------------------------------------------------------

    def allow(self, match: int = 0) -> bool:
        """Called once per decode step: may this step speculate? `match`: how many tokens the draft source's
        current match spans (0 when it cannot say)."""
        if self.state == self.OFF:
            if self._off_left > 0:
                self._off_left -= 1
                return match >= self.confident_match
            self.state = self.PROBE
            self._probe_left = self.probe_steps
            self._window.clear()
        return True

    def record_step(self, rows: int, produced: int, drafted: int, accepted: int) -> None:
        """One verify step over `rows` rows that produced `produced` tokens from a draft of `drafted`."""
        self._window.append((produced, self.cost(rows), drafted, accepted))
        if self.state == self.ON:
            est = self.est_speedup()
            if est is not None and est < self.min_speedup:
                self._turn_off()
        elif self.state == self.OFF:  # a confident step: back on once they pay
            est = self.est_speedup()
            if est is not None and est >= self.min_speedup + self.probe_margin:
                self.state = self.ON
                self._backoff = self.reprobe_after
        elif self.state == self.PROBE:
            self._probe_left -= 1
            if self._probe_left <= 0:
                produced, cost, _, _ = self._sums()
                if produced / cost >= self.min_speedup + self.probe_margin:
                    self.state = self.ON
                    self._backoff = self.reprobe_after
                else:
                    self._backoff = min(self._backoff * 2, self.reprobe_max)
                    self._turn_off()

    def _turn_off(self) -> None:
        self.state = self.OFF
        self._off_left = self._backoff
        self._window.clear()


def _check_table(table: Mapping[int, float]) -> None:
    if not table:
        raise InvalidSpeculationConfig("the verify-cost table is empty (measure it with measure_verify_costs)")
    if 1 not in table:
        raise InvalidSpeculationConfig("the verify-cost table needs the plain step's cost (rows = 1)")
    for rows, seconds in table.items():
        if not isinstance(rows, int) or rows < 1 or not seconds > 0:
            raise InvalidSpeculationConfig(f"verify-cost table entry {rows!r}: {seconds!r} must map a row "
                                           f"count >= 1 to a positive time")
