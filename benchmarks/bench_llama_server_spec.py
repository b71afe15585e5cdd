"""llama-server's own n-gram speculation on the speculative-decoding workloads: the peer figures that
`fucina bench --spec` is reported beside.

    FUCINA_LLAMA_SERVER=build/bin/llama-server python benchmarks/bench_llama_server_spec.py MODEL \
        [--workload NAME|FILE ...] [--modes none,ngram-simple,ngram-map-k,ngram-mod] [--runs 3] [--threads 2]

For each mode one llama-server is started on the same GGUF and thread count, and every workload's turns are
sent as one growing chat (greedy, the workload's max_tokens; "{previous}" is the server's own previous reply
with the workload's edits). Decode speed is llama-server's own `timings.predicted_per_second`, summed over a
run's turns as tokens over time; drafted and accepted tokens come from its `timings` too. Each mode's replies
are compared with the plain (`none`) ones: a mode whose text differs is marked `"identical": false`.
Reports only: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.benchmarks.peer import summary  # noqa: E402
from engine.benchmarks.speculation import Workload, load_workload  # noqa: E402
from engine.platform.catalog import resolve_model  # noqa: E402

WORKLOADS = ROOT / "benchmarks" / "workloads"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def _start(server: str, model: Path, mode: str, threads: int, context: int) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    args = [server, "-m", str(model), "-t", str(threads), "-tb", str(threads), "-c", str(context), "--port", str(port),
            "--host", "127.0.0.1", "-np", "1", "--no-webui"]
    if mode != "none":
        args += ["--spec-type", mode]
    env = dict(os.environ, LD_LIBRARY_PATH=str(Path(server).resolve().parent))
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server ({mode}) exited: {proc.stderr.read().decode(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"llama-server ({mode}) did not become ready in 120 s")


def _run(port: int, workload: Workload) -> dict:
    messages = [{"role": "system", "content": workload.system}] if workload.system else []
    tokens = drafted = accepted = 0
    seconds = 0.0
    texts, previous = [], ""
    for i in range(len(workload.turns)):
        messages.append({"role": "user", "content": workload.user_message(i, previous)})
        reply = _post(port, "/v1/chat/completions", {
            "messages": messages, "max_tokens": workload.max_tokens, "temperature": 0, "top_k": 1,
            "cache_prompt": False, "seed": 0})
        previous = reply["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": previous})
        texts.append(previous)
        t = reply["timings"]
        tokens += t["predicted_n"]
        seconds += t["predicted_ms"] / 1e3
        drafted += t.get("draft_n", 0)
        accepted += t.get("draft_n_accepted", 0)
    return {"tps": tokens / seconds if seconds else 0.0, "tokens": tokens, "drafted": drafted,
            "accepted": accepted, "texts": texts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--workload", action="append", help="a name under benchmarks/workloads or a JSON file")
    parser.add_argument("--modes", default="none,ngram-simple,ngram-map-k,ngram-mod")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=8192)
    args = parser.parse_args()
    server = os.environ.get("FUCINA_LLAMA_SERVER")
    if not server:
        sys.exit("error: set FUCINA_LLAMA_SERVER to a llama-server binary (see BENCHMARKS.md)")
    model = resolve_model(args.model)
    names = args.workload or sorted(p.stem for p in WORKLOADS.glob("*.json"))
    workloads = [load_workload(n if n.endswith(".json") else WORKLOADS / f"{n}.json") for n in names]
    modes = args.modes.split(",")
    runs: dict[str, dict[str, list[dict]]] = {m: {w.name: [] for w in workloads} for m in modes}
    for mode in modes:
        proc, port = _start(server, model, mode, args.threads, args.context)
        try:
            _post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
            for w in workloads:
                for r in range(args.runs):
                    runs[mode][w.name].append(_run(port, w))
                    print(f"{mode} {w.name} run {r + 1}: {runs[mode][w.name][-1]['tps']:.1f} tok/s", file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    report = []
    for w in workloads:
        plain = runs["none"][w.name] if "none" in runs else None
        for mode in modes:
            rs = runs[mode][w.name]
            row = {"workload": w.name, "mode": mode, "tps": summary([r["tps"] for r in rs]),
                   "drafted": rs[-1]["drafted"], "accepted": rs[-1]["accepted"], "tokens": rs[-1]["tokens"]}
            if plain:
                row["speedup"] = summary([r["tps"] / p["tps"] for r, p in zip(rs, plain) if p["tps"]])
                row["identical"] = all(r["texts"] == p["texts"] for r, p in zip(rs, plain))
            report.append(row)
    print(json.dumps({"model": str(model.name), "threads": args.threads, "runs": args.runs, "results": report},
                     indent=1))


if __name__ == "__main__":
    main()
