"""Kill a piped `fucina chat --conversation` with SIGKILL at random moments, and check what survives.

    python -m tests.sigkill_chat --kills 60 [--seed 1] [--model smollm2-135m-instruct | FILE.gguf] [--home DIR]

Each round starts `python -m app.cli chat MODEL --conversation new|ID` in a scratch data dir (FUCINA_HOME)
with a few piped messages, each followed by /stats (its line on stdout comes after the reply before it was
committed), and kills it at a random moment: a quarter of the kills while it opens (imports, loads the
model and the sidecar), the rest once the conversation is open (it prefills, streams, commits, writes the
sidecar), within the longest time a finished round took. Every few rounds starts a new conversation.
After each round it counts:

  integrity failures  the history database's PRAGMA integrity_check is not ok
  messages lost       a message stored before the round, or a reply the round confirmed, is not stored
                      (or changed)
  sidecar failures    reopening the conversation (as the next `fucina chat` would, on a copy) resumes tokens
                      that disagree with the stored branch's render (neither is a prefix of the other: a
                      reply may be in the sidecar before it is committed; and the last reply's sampled
                      tokens may differ from its text's tokens, which the next reply prefills again), or
                      KV rows (and a hybrid model's state) that are not the model's for those tokens
                      (recomputed and compared)
  crashes             the chat printed a traceback or an error line

and prints them, with what the chat was doing at each kill (opening: before the conversation was open;
reply N; closing: after the last reply); the exit status is 1 when any count is not 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
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
    retokenized: int = 0        # warm checks whose last reply's text tokenizes otherwise than it was sampled
    worst_row_error: float = 0.0
    crashes: int = 0            # rounds whose chat printed a traceback or an error line
    killed_in: Counter = field(default_factory=Counter)  # what the chat was doing when killed
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.integrity_failures or self.messages_lost or self.sidecar_failures or self.crashes)

    def summary(self) -> str:
        phases = ", ".join(f"{phase} {n}" for phase, n in sorted(self.killed_in.items()))
        return (f"{self.kills} kills ({phases}; {self.finished} rounds finished first): integrity failures "
                f"{self.integrity_failures}, messages lost {self.messages_lost}, sidecar failures "
                f"{self.sidecar_failures}, crashes {self.crashes}; reopened warm {self.warm} "
                f"({self.retokenized} with a last reply that tokenizes otherwise), cold {self.cold}; "
                f"worst resumed row error "
                f"{self.worst_row_error:.3f}")


def run(kills: int, model_path: Path, *, seed: int = 0, home: Path | None = None, per_conversation: int = 5,
        log=print) -> Report:
    from engine.models import load_model

    checker = load_model(model_path)
    rng = random.Random(seed)
    home = Path(home or tempfile.mkdtemp(prefix="fucina-sigkill-"))
    report, cid, rounds, seen = Report(), None, 0, 0
    opening_s = talking_s = None  # of the longest finished rounds: start to open, open to exit
    while report.kills < kills and rounds < 3 * kills:
        if rounds % per_conversation == 0:
            cid = None
        before = _messages(home)
        lines = [line for message in rng.sample(MESSAGES, 3) for line in (message, "/stats")]
        kill = None  # the first round runs to its end, to time one
        if opening_s is not None:  # a quarter of the kills while the chat opens, the rest once it is open
            opening = rng.random() < 0.25
            kill = ("start", rng.uniform(0, opening_s)) if opening else ("open", rng.uniform(0, talking_s))
        r = _round(home, model_path, cid or "new", lines, kill)
        rounds += 1
        confirmed = len(_STATS_LINE.findall(r.out))
        if "Traceback" in r.err or "error:" in r.err:
            report.crashes += 1
            report.problems.append(f"round {rounds}: {r.err.strip()[-2000:]}")
        if r.killed:
            report.kills += 1
            report.killed_in["opening" if r.opened_s is None else "closing" if confirmed == 3 else
                             f"reply {confirmed + 1}"] += 1
        elif r.opened_s is not None:
            report.finished += kill is not None
            opening_s = max(opening_s or 0, r.opened_s)
            talking_s = max(talking_s or 0, r.total_s - r.opened_s)
        cid = cid or _newest_conversation(home)
        _check(report, home, checker, cid, before, confirmed)
        when = f"killed {kill[1]:.1f} s after its {kill[0]}" if r.killed else "finished"
        log(f"round {rounds}: {when}; {report.summary()}")
        for problem in report.problems[seen:]:
            log(f"  {problem}")
        seen = len(report.problems)
    return report


@dataclass
class _Round:
    out: str
    err: str
    killed: bool
    opened_s: float | None  # from the start until the conversation was open (None: it never opened)
    total_s: float


def _round(home: Path, model_path: Path, conversation: str, lines: list[str],
           kill: tuple[str, float] | None) -> _Round:
    """Run one piped chat, killed (unless it ends first) `kill` = ("start" | "open", seconds) after it
    started or after it opened the conversation (its notice on stderr); None lets it end."""
    env = os.environ | {"FUCINA_HOME": str(home), "FUCINA_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "chat", str(model_path), "--conversation",
                             conversation, "--max-tokens", "16"], cwd=REPO, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    started = time.monotonic()
    proc.stdin.write("".join(f"{line}\n" for line in lines))
    proc.stdin.close()
    err, opened = [], []

    def read_stderr():
        for line in proc.stderr:
            if line.startswith("(conversation "):
                opened.append(time.monotonic() - started)
            err.append(line)

    reader = threading.Thread(target=read_stderr)
    reader.start()
    killed = False
    if kill is not None:
        while kill[0] == "open" and not opened and proc.poll() is None:
            time.sleep(0.005)
        try:
            proc.wait(kill[1])
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            killed = True
    proc.wait()
    total = time.monotonic() - started
    reader.join()
    return _Round(proc.stdout.read(), "".join(err), killed, opened[0] if opened else None, total)


def _query(home: Path, sql: str) -> list[tuple]:
    """Rows of `sql` over the data dir's history database (none before it exists)."""
    db = home / "history.db"
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute(sql).fetchall()


def _messages(home: Path) -> dict[str, tuple]:
    return {row[0]: row[1:] for row in _query(home, "SELECT id, conversation_id, role, content FROM messages")}


def _newest_conversation(home: Path) -> str | None:
    rows = _query(home, "SELECT id FROM conversations ORDER BY created_at DESC, rowid DESC LIMIT 1")
    return rows[0][0] if rows else None


def _check(report: Report, home: Path, model, cid: str | None, before: dict, confirmed: int) -> None:
    verdict = _query(home, "PRAGMA integrity_check") or [("ok",)]
    if verdict[0][0] != "ok":
        report.integrity_failures += 1
        report.problems.append(f"integrity_check: {verdict}")
    after = _messages(home)
    lost = [mid for mid, row in before.items() if after.get(mid) != row]
    replies = sum(1 for mid, (c, role, _) in after.items()
                  if mid not in before and c == cid and role == "assistant")
    report.messages_lost += len(lost) + max(confirmed - replies, 0)
    if lost or confirmed > replies:
        report.problems.append(f"lost {lost}, {confirmed} replies confirmed but {replies} stored")
    if cid is not None:
        _check_sidecar(report, home, model, cid)


def _check_sidecar(report: Report, home: Path, model, cid: str) -> None:
    """Reopen the conversation on a copy of the data dir (reopening writes the sidecar) and compare what it
    resumed with the stored branch and with the model's own KV rows for the resumed tokens."""
    from engine.history.store import HistoryStore
    from engine.serving.session import ChatSession

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
    def prompt(messages):  # the ids a reply to `messages` is conditioned on
        return session._window(messages)[0].ids

    # where the last reply's tokens start: its sampled tokens may differ from its text's (the next reply
    # prefills it again), while every earlier reply was rendered again when the next one was prefilled
    replies = [i for i, m in enumerate(branch) if m["role"] == "assistant"]
    last_reply = len(prompt(branch[:replies[-1]])) if replies else None
    if not branch or branch[-1]["role"] == "assistant":  # render it as the next message would
        branch.append({"id": "next", "role": "user", "content": "Next.", "reasoning": None, "meta": {},
                       "tool_calls": [], "tool_result": None})
    render = prompt(branch)
    n = min(len(tokens), len(render))
    if tokens[:n] != render[:n]:
        at = next(i for i in range(n) if tokens[i] != render[i])
        if last_reply is not None and at >= last_reply:
            report.retokenized += 1
        else:
            report.sidecar_failures += 1
            report.problems.append(f"{cid}: resumed tokens leave the branch's render at {at} of {n}")
    error = _row_error(model, session.convo.cache, tokens)
    report.worst_row_error = max(report.worst_row_error, error)
    if error > ROW_TOLERANCE:
        report.sidecar_failures += 1
        report.problems.append(f"{cid}: resumed KV rows differ from the model's by {error:.3g}")


def _row_error(model, cache, tokens: list[int]) -> float:
    """The largest relative error of one position's rows (a layer's K or V) in the cache, or of a recurrent
    layer's state (a hybrid model's), against the model's for `tokens` computed afresh. A reply's rows were
    decoded a token at a time and the fresh ones are prefilled at once, so they differ a little (about 0.05);
    a damaged row by about 1."""
    from tests.kv_rows import keys_f32, values_f32

    n = len(tokens)
    fresh = model.new_cache(n, cache.dtype)
    model.forward(tokens, fresh)
    pairs = [pair for layer in range(cache.n_layers)
             for pair in ((keys_f32(cache, layer, n), keys_f32(fresh, layer, n)),
                          (values_f32(cache, layer, n), values_f32(fresh, layer, n)))]
    for layer in range(len(cache.state_shapes)):  # one "row" each: the whole conv window, the whole state
        pairs += [(got[None], want[None]) for got, want in zip(cache.state_store.read(layer),
                                                               fresh.state_store.read(layer))]
    worst = 0.0
    for got, want in pairs:
        rows = len(got)
        with np.errstate(all="ignore"):
            error = (np.linalg.norm((got - want).reshape(rows, -1), axis=1)
                     / np.maximum(np.linalg.norm(want.reshape(rows, -1), axis=1), 1e-6))
        worst = max(worst, float(np.max(np.nan_to_num(error, nan=np.inf))))
    return worst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="smollm2-135m-instruct", help="a catalog model, or a GGUF file's path")
    p.add_argument("--home", type=Path, default=None, help="data dir to use (default: a new temporary one)")
    args = p.parse_args(argv)
    from engine.platform.catalog import models_dir, pull

    model = Path(args.model) if args.model.endswith(".gguf") else pull(args.model, directory=models_dir())
    report = run(args.kills, model, seed=args.seed, home=args.home)
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
