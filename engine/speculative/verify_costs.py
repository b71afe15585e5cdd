"""The cost gate's verify-cost table for one model on this machine (spec 13.9.1).

Measured once per model, thread count and build of the kernels at first use -- a short run of
`measure_verify_costs` over a scratch cache, m = 1..MAX_ROWS -- and kept in the user cache dir under those,
so later processes read it back (new kernels change the costs: they are measured again). The table only
steers the gate (when speculation runs), never what is committed, so a stale or unreadable file is simply
measured again.
"""

from __future__ import annotations

import json
import weakref

from engine.kv.persist import model_fingerprint
from engine.platform.paths import cache_dir
from engine.speculative.gate import measure_verify_costs
from kernels.backend import kernel_threads
from kernels.common import COMPILED_ID as KERNELS_BUILD

MAX_ROWS = 17      # a verify over the last token and a draft of up to 16
CONTEXT_ROWS = 32  # the scratch cache's context: verify cost at a short conversation's length
REPEATS = 1        # one timed call per m after a warm-up: first use stays short; the gate rescales online

_MEASURED: "weakref.WeakKeyDictionary[object, dict[tuple[bytes, int], dict[int, float]]]" = \
    weakref.WeakKeyDictionary()


def verify_cost_table(model) -> dict[int, float]:
    """Seconds for a verify forward over m rows, m = 1..MAX_ROWS: this process's, the cache dir's, or a
    fresh measurement (which is then stored)."""
    threads = kernel_threads()
    per_model = _MEASURED.setdefault(model, {})
    fingerprint = model_fingerprint(model.file)
    key = (fingerprint, threads)
    if key not in per_model:
        path = cache_dir() / "verify-costs" / f"{fingerprint.hex()[:32]}-t{threads}-k{KERNELS_BUILD}.json"
        table = _read(path)
        if table is None:
            table = measure(model)
            _write(path, table)
        per_model[key] = table
    return dict(per_model[key])


def measure(model) -> dict[int, float]:
    cache = model.new_cache(CONTEXT_ROWS + MAX_ROWS)
    model.rows_ready(cache, wait=True)  # the costs of the verify kernels, not of the one-row ones standing in
    context = [i % model.vocab_size for i in range(CONTEXT_ROWS)]
    model.feed(context, cache)
    cache.mark()  # each run goes back here (a recurrent state can only go back to a mark)
    rows = [(7 * i + 3) % model.vocab_size for i in range(MAX_ROWS)]

    def run_rows(m: int) -> None:
        model.forward_rows(rows[:m], cache)
        cache.truncate(CONTEXT_ROWS)

    return measure_verify_costs(run_rows, max_rows=MAX_ROWS, repeats=REPEATS)


def _read(path) -> dict[int, float] | None:
    try:
        raw = json.loads(path.read_text())
        table = {int(m): float(s) for m, s in raw["seconds"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if set(table) != set(range(1, MAX_ROWS + 1)) or not all(s > 0 for s in table.values()):
        return None
    return table


def _write(path, table: dict[int, float]) -> None:
    """Best effort: an unwritable cache dir costs a measurement next time, nothing else."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"seconds": {str(m): s for m, s in table.items()}}))
        tmp.replace(path)
    except OSError:
        pass
