"""The reopen benchmark: time to the first token of the next reply in a long stored conversation, reopened
warm from its KV sidecar versus re-prefilled from its messages.

The model stays loaded (as in the app, where reopening a chat does not reload the model); each timed run
starts from the same saved files (history database and sidecar), opens the session, sends one message and
stops at its first token. The warm runs include loading the sidecar.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from engine.benchmarks.peer import summary
from engine.history.store import HistoryStore
from engine.kv import persist
from engine.kv.state_persist import state_path
from engine.models import load_model
from engine.serving.session import ChatSession, sidecar_path

NEXT_MESSAGE = "Thanks. Summarise our conversation in one sentence."
_FILLER_USER = "Tell me fact number {i} about the sea, in a few sentences."
_FILLER_REPLY = ("Fact {i}: the sea covers most of the planet, holds most of its water and most of its living "
                 "space. Its currents carry heat from the equator towards the poles, its tides follow the moon, "
                 "and its depths, in places more than ten kilometres, are still largely unexplored.")


def reopen_benchmark(path: str, n_tokens: int, runs: int, log: Callable[[str], None] = lambda s: None) -> dict:
    model = load_model(path)
    with tempfile.TemporaryDirectory(prefix="fucina-reopen-") as tmp:
        saved, work = Path(tmp) / "saved", Path(tmp) / "work"
        cid, held = _build_conversation(model, saved, n_tokens, log)
        warm, cold = [], []
        for i in range(runs):
            for sidecar, results in ((True, warm), (False, cold)):
                results.append(_first_token(model, saved, work, cid, sidecar))
                log(f"run {i + 1}/{runs} {'warm' if sidecar else 'cold'}: first token after "
                    f"{results[-1]['ttft_s']:.3f} s ({results[-1]['prefilled_tokens']} tokens prefilled)")
        sidecar = sidecar_path(cid, saved / "sidecars")
        sidecar_bytes = sidecar.stat().st_size
        state = Path(state_path(sidecar))  # a hybrid model's state checkpoint beside it
        state_bytes = state.stat().st_size if state.exists() else 0
    warm_s, cold_s = [r["ttft_s"] for r in warm], [r["ttft_s"] for r in cold]
    return {
        "model": str(path), "conversation_tokens": held, "runs": runs,
        "warm_ttft_s": summary(warm_s), "cold_ttft_s": summary(cold_s),
        "speedup": summary([c / w for c, w in zip(cold_s, warm_s)]),
        "warm_prefilled_tokens": warm[0]["prefilled_tokens"], "warm_reused_tokens": warm[0]["reused_tokens"],
        "cold_prefilled_tokens": cold[0]["prefilled_tokens"],
        "sidecar_bytes": sidecar_bytes, "sidecar_bytes_per_token": warm[0]["bytes_per_token"],
        "state_checkpoint_bytes": state_bytes,
    }


def _build_conversation(model, home: Path, n_tokens: int, log) -> tuple[str, int]:
    """A stored conversation whose render is about n_tokens long, its last reply generated (so its sidecar
    holds the whole history). Returns its id and the positions the sidecar holds."""
    with HistoryStore(home / "history.db") as store:
        session = ChatSession.open(store, model, sidecar_dir=home / "sidecars",
                                   sampler={"temperature": 0.0, "max_tokens": 8, "ctx": n_tokens + 512})
        i = 0
        while True:
            store.add_message(session.id, "user", _FILLER_USER.format(i=i))
            if session.prompt_length() >= n_tokens:
                break
            store.add_message(session.id, "assistant", _FILLER_REPLY.format(i=i))
            i += 1
        log(f"prefilling a {session.prompt_length()}-token conversation")
        "".join(session.regenerate())  # answers the last user message: prefills everything, saves the sidecar
        session.close()
        return session.id, session.context_used


def _first_token(model, saved: Path, work: Path, cid: str, sidecar: bool) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(saved, work)
    if not sidecar:
        sidecar_path(cid, work / "sidecars").unlink()
        Path(state_path(sidecar_path(cid, work / "sidecars"))).unlink(missing_ok=True)
    if hasattr(os, "sync"):  # the copy's writeback is not the reopen's: it would compete for the cores while timed
        os.sync()
    with HistoryStore(work / "history.db") as store:
        t0 = time.perf_counter()
        session = ChatSession(store, model, cid, sidecar_dir=work / "sidecars")
        stream = session.send(NEXT_MESSAGE)
        next(stream)
        ttft = time.perf_counter() - t0
        stream.close()
        stats = session.last_turn.stats
        session.close()
        return {"ttft_s": ttft, "prefilled_tokens": stats.prefilled_tokens, "reused_tokens": stats.reused_tokens,
                "bytes_per_token": persist.bytes_per_token(session.convo.cache)}
