"""Kill a piped `fucina chat --conversation` with SIGKILL at random moments, and check what survives.

    python -m tests.sigkill_chat --kills 60 [--seed 1] [--model smollm2-135m-instruct] [--home DIR]

Each round starts `python -m app.cli chat MODEL --conversation new|ID` in a scratch data dir (FUCINA_HOME)
with a few piped messages, each followed by /stats (its line on stdout comes after the reply before it was
committed), and kills it at a random moment of a round's run time: while it starts, loads the sidecar,
prefills, streams, commits, or writes the sidecar. Every few rounds starts a new conversation. After each
round it counts:

  integrity failures  the history database's PRAGMA integrity_check is not ok
  messages lost       a message stored before the round, or a reply the round confirmed, is not stored
                      (or changed)
  sidecar failures    reopening the conversation (as the next `fucina chat` would, on a copy) resumes tokens
                      that disagree with the stored branch's render (neither is a prefix of the other: a
                      reply may be in the sidecar before it is committed), or KV rows that are not the
                      model's for those tokens (recomputed and compared)

and prints them; the exit status is 1 when any is not 0.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).parents[1]
MESSAGES = ("Hello there.", "Name a colour.", "What is two plus two?", "Tell me a short fact.",
            "Say something kind.", "Which is bigger, a cat or a mouse?")
_STATS_LINE = re.compile(r"^prompt \d+ tokens \(", re.M)  # what /stats prints after a committed reply
ROW_TOLERANCE = 0.25  # see _row_error


@dataclass
class Report:
    kills: int = 0
    finished: int = 0           # rounds that ended before their kill moment
    integrity_failures: int = 0
    messages_lost: int = 0
    sidecar_failures: int = 0
    warm: int = 0               # checks that resumed positions from the sidecar
    cold: int = 0               # checks that resumed nothing (no sidecar yet, or nothing verified)
    worst_row_error: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.integrity_failures or self.messages_lost or self.sidecar_failures)

    def summary(self) -> str:
        return (f"{self.kills} kills ({self.finished} rounds finished first): integrity failures "
                f"{self.integrity_failures}, messages lost {self.messages_lost}, sidecar failures "
                f"{self.sidecar_failures}; reopened warm {self.warm}, cold {self.cold}; worst resumed row error "
                f"{self.worst_row_error:.3f}")


def run(kills: int, *, seed: int = 0, model: str = "smollm2-135m-instruct", home: Path | None = None,
        per_conversation: int = 5, log=print) -> Report:
    from engine.catalog import models_dir, pull
    from engine.models import load_model

    model_path = pull(model, directory=models_dir())
    checker = load_model(model_path)
    rng = random.Random(seed)
    home = Path(home or tempfile.mkdtemp(prefix="fucina-sigkill-"))
    report, cid, rounds, span = Report(), None, 0, None
    while report.kills < kills and rounds < 3 * kills:
        if rounds % per_conversation == 0:
            cid = None
        before = _messages(home)
        lines = [m for m in rng.sample(MESSAGES, 3) for m in (m, "/stats")]
        kill_at = None if span is None else rng.uniform(0, span)  # the first round measures a run's span
        started = time.monotonic()
        out, killed = _round(home, model_path, cid or "new", lines, kill_at)
        rounds += 1
        if killed:
            report.kills += 1
        else:
            report.finished += span is not None
            span = time.monotonic() - started
        cid = cid or _newest_conversation(home)
        _check(report, home, checker, cid, before, confirmed=len(_STATS_LINE.findall(out)))
        log(f"round {rounds}: {'killed at %.1f s' % kill_at if killed else 'finished'}; {report.summary()}")
    return report


def _round(home: Path, model_path: Path, conversation: str, lines: list[str], kill_at: float | None):
    """Run one piped chat, killed at `kill_at` seconds unless it ends first: (its stdout, killed)."""
    env = os.environ | {"FUCINA_HOME": str(home), "FUCINA_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "chat", str(model_path), "--conversation",
                             conversation, "--max-tokens", "16"], cwd=REPO, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    proc.stdin.write("".join(f"{line}\n" for line in lines))
    proc.stdin.close()
    try:
        proc.wait(kill_at)
        killed = False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed = True
    return proc.stdout.read(), killed


def _messages(home: Path) -> dict[str, tuple]:
    db = home / "history.db"
    if not db.exists():
        return {}
    with sqlite3.connect(db) as conn:
        return {row[0]: row[1:] for row in conn.execute("SELECT id, conversation_id, role, content FROM messages")}


def _newest_conversation(home: Path) -> str | None:
    db = home / "history.db"
    if not db.exists():
        return None
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT id FROM conversations ORDER BY created_at DESC, rowid DESC LIMIT 1").fetchone()
    return row and row[0]


def _check(report: Report, home: Path, model, cid: str | None, before: dict, confirmed: int) -> None:
    db = home / "history.db"
    if db.exists():
        with sqlite3.connect(db) as conn:
            verdict = conn.execute("PRAGMA integrity_check").fetchone()[0]
        if verdict != "ok":
            report.integrity_failures += 1
            report.problems.append(f"integrity_check: {verdict}")
    after = _messages(home)
    lost = [mid for mid, row in before.items() if after.get(mid) != row]
    replies = sum(1 for mid, (c, role, _) in after.items() if mid not in before and c == cid and role == "assistant")
    report.messages_lost += len(lost) + max(confirmed - replies, 0)
    if lost or confirmed > replies:
        report.problems.append(f"lost {lost}, {confirmed} replies confirmed but {replies} stored")
    if cid is not None:
        _check_sidecar(report, home, model, cid)


def _check_sidecar(report: Report, home: Path, model, cid: str) -> None:
    """Reopen the conversation on a copy of the data dir (reopening writes the sidecar) and compare what it
    resumed with the stored branch and with the model's own KV rows for the resumed tokens."""
    from engine.history.store import HistoryStore
    from engine.session import ChatSession

    copy = Path(tempfile.mkdtemp(prefix="fucina-sigkill-check-"))
    try:
        for name in ("history.db", "history.db-wal", "history.db-shm"):
            if (home / name).exists():
                shutil.copy(home / name, copy / name)
        if (home / "sidecars").exists():
            shutil.copytree(home / "sidecars", copy / "sidecars")
        with HistoryStore(copy / "history.db") as store:
            session = ChatSession(store, model, cid, sidecar_dir=copy / "sidecars")
            session.close()
            resumed = session.resumed_positions
            report.warm += resumed > 0
            report.cold += resumed == 0
            if resumed:
                _compare(report, cid, model, session)
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def _compare(report: Report, cid: str, model, session) -> None:
    tokens = session.convo.history[:session.resumed_positions]
    branch = session.messages()
    if not branch or branch[-1]["role"] == "assistant":  # render it as the next message would
        branch.append({"role": "user", "content": "Next."})
    render = session.convo.tokenizer.encode(session._render(branch), add_special=True)
    n = min(len(tokens), len(render))
    if tokens[:n] != render[:n]:
        at = next(i for i in range(n) if tokens[i] != render[i])
        report.sidecar_failures += 1
        report.problems.append(f"{cid}: resumed tokens leave the branch's render at {at} of {n}")
    error = _row_error(model, session.convo.cache, tokens)
    report.worst_row_error = max(report.worst_row_error, error)
    if error > ROW_TOLERANCE:
        report.sidecar_failures += 1
        report.problems.append(f"{cid}: resumed KV rows differ from the model's by {error:.3g}")


def _row_error(model, cache, tokens: list[int]) -> float:
    """The largest relative error of one position's rows (a layer's K or V) in the cache against the
    model's rows for `tokens` computed afresh. A reply's rows were decoded a token at a time and the
    fresh ones are prefilled at once, so they differ a little (about 0.05); a damaged row by about 1."""
    n = len(tokens)
    fresh = model.new_cache(n, cache.dtype)
    model.forward(tokens, fresh)
    worst = 0.0
    for layer in range(cache.n_layers):
        for got, want in ((cache.keys_f32(layer, n), fresh.keys_f32(layer, n)),
                          (cache.values_f32(layer, n), fresh.values_f32(layer, n))):
            with np.errstate(all="ignore"):
                error = (np.linalg.norm((got - want).reshape(n, -1), axis=1)
                         / np.maximum(np.linalg.norm(want.reshape(n, -1), axis=1), 1e-6))
            worst = max(worst, float(np.max(np.nan_to_num(error, nan=np.inf))))
    return worst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--home", type=Path, default=None, help="data dir to use (default: a new temporary one)")
    args = p.parse_args(argv)
    report = run(args.kills, seed=args.seed, model=args.model, home=args.home)
    print(report.summary())
    for problem in report.problems:
        print(f"  {problem}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
