"""Weights stay in source precision: serving Qwen2.5-0.5B with a 4k cache stays within
1.3 x the GGUF size + the cache (measured in a fresh process, above what the process held once the engine
was imported: the interpreter, NumPy and Numba are not serving memory, and their share varies by machine).

The workload runs twice, each in a fresh process: the first fills Numba's on-disk cache if it is
cold, the second is measured, so one-time JIT compilation is not counted as serving memory."""

import json
import subprocess
import sys
import textwrap

SERVE = textwrap.dedent("""
    import json, sys
    from engine.models import load_model
    from engine.benchmarks.peer import prompt_ids

    def status_kb(field):
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field))

    runtime_kb = status_kb("VmRSS:")
    model = load_model(sys.argv[1])
    cache = model.new_cache(4096)
    logits = model.forward(prompt_ids(model.vocab_size, 512), cache)
    for _ in range(16):
        logits = model.forward([int(logits.argmax())], cache)
    # VmHWM is this process image's own peak; ru_maxrss would carry over the forking parent's (pytest's) peak
    print(json.dumps({"peak_rss": status_kb("VmHWM:") * 1024, "runtime_rss": runtime_kb * 1024,
                      "cache_bytes": cache.byte_size(), "file_bytes": model.file.file_size()}))
""")


def test_qwen_peak_rss_with_4k_cache(model_path):
    serve = [sys.executable, "-c", SERVE, str(model_path("qwen2.5-coder-0.5b-instruct"))]
    subprocess.run(serve, capture_output=True, check=True)  # warms Numba's cache
    out = subprocess.run(serve, capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    serving = r["peak_rss"] - r["runtime_rss"]
    budget = 1.3 * r["file_bytes"] + r["cache_bytes"]
    print(f"\npeak RSS {r['peak_rss'] / 2**20:.0f} MiB, {serving / 2**20:.0f} MiB above the imported engine's "
          f"{r['runtime_rss'] / 2**20:.0f} MiB; budget {budget / 2**20:.0f} MiB "
          f"(file {r['file_bytes'] / 2**20:.0f} MiB, cache {r['cache_bytes'] / 2**20:.0f} MiB)")
    assert serving <= budget
