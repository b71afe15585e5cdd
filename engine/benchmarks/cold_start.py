"""`fucina bench --cold-start MODEL`: the first reply on a fresh machine, after the model has downloaded.

A child process runs with an empty kernel cache (NUMBA_CACHE_DIR and XDG_CACHE_HOME in a new temporary
directory) and does what the app does on its first start: it starts the kernel warm-up (engine.platform.warmup)
and, `download_s` seconds later (the download, simulated: the model is on disk already), waits for the
stages the first reply needs, starts the verify stage beside it, loads the model and sends one message.
The figure is the time from the download's end to the reply's first token; with `warmup` off, the kernels
compile at that first reply instead (the app before the warm-up).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from engine.platform.catalog import catalog, pull


def cold_start(name: str, download_s: float = 0.0, warmup: bool = True) -> dict:
    pull(name)  # on disk before the clock starts: the download itself is not what is measured
    with tempfile.TemporaryDirectory(prefix="fucina-cold-") as tmp:
        env = {**os.environ, "NUMBA_CACHE_DIR": os.path.join(tmp, "numba"),
               "XDG_CACHE_HOME": os.path.join(tmp, "cache")}
        run = subprocess.run([sys.executable, "-m", "engine.benchmarks.cold_start", name, str(download_s), str(int(warmup))],
                             env=env, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"the cold-start run failed: {run.stderr.strip()[-2000:]}")
    return json.loads(run.stdout.splitlines()[-1]) | {"model": name, "download_s": download_s, "warmup": warmup}


def _child(name: str, download_s: float, warmup: bool) -> dict:
    from engine.platform import warmup as kernel_warmup
    from engine.chat import ChatOptions, Conversation
    from engine.models import load_model
    from kernels.common import cpu_target

    def stages_to_run(stages: tuple[str, ...]) -> tuple[str, ...]:
        """As the app does: none when the warm-up is off or done before (shipped kernels bring its marks)."""
        return () if not warmup or kernel_warmup.is_warm(catalog()[name], stages) else stages

    started = time.perf_counter()
    stages = kernel_warmup.start(name, stages=stages_to_run(kernel_warmup.STAGES))
    time.sleep(download_s)
    downloaded = time.perf_counter()
    for proc in stages:
        if proc.wait() != 0:
            raise RuntimeError(f"warm-up failed: {proc.stderr.read().decode()[-2000:]}")
    warm = time.perf_counter()
    # as the app does: the verify stage starts now, beside the first reply, which does not wait for it
    later = kernel_warmup.start(name, stages=stages_to_run(kernel_warmup.LATER_STAGES))
    model = load_model(catalog()[name].path())
    loaded = time.perf_counter()
    reply = Conversation.for_model(model, ChatOptions(max_tokens=8)).send("Hello! Who are you?")
    next(reply)
    first = time.perf_counter()
    reply.close()
    for proc in later:
        proc.kill()
    return {"warmup_s": warm - started, "wait_after_download_s": warm - downloaded, "load_s": loaded - warm,
            "first_token_after_download_s": first - downloaded, "kernel_target": cpu_target.describe(),
            "warmup_stages_run": len(stages)}


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1")))
