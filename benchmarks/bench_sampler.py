"""Sampler cost per token on a Gemma-sized vocabulary (262,144 entries) and on SmolLM2's (49,152).

    python benchmarks/bench_sampler.py [--vocab 262144] [--tokens 300]

Logits are random with the spread of a real model row (a few clear leaders over a long flat tail). For each
setting it reports the median microseconds per `Sampler.sample` call over a short history with penalties
where the setting has them. Reports only: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.sampling import Sampler, SamplerConfig  # noqa: E402

SETTINGS = {
    "greedy": SamplerConfig(),
    "greedy + repeat penalty": SamplerConfig(repeat_penalty=1.1),
    "top-k 40, T 0.8": SamplerConfig(temperature=0.8, top_k=40),
    "top-k 40, top-p 0.95, T 0.8": SamplerConfig(temperature=0.8, top_k=40, top_p=0.95),
    "exact nucleus top-p 0.9, T 0.7": SamplerConfig(temperature=0.7, top_p=0.9),
    "full vocabulary, T 1.0": SamplerConfig(temperature=1.0),
    "min-p 0.05, T 1.0": SamplerConfig(temperature=1.0, min_p=0.05),
}


def model_like_logits(vocab: int, rows: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((rows, vocab)).astype(np.float32) * 2.0
    leaders = rng.integers(0, vocab, size=(rows, 8))
    np.put_along_axis(logits, leaders, rng.uniform(12, 18, size=(rows, 8)).astype(np.float32), axis=1)
    return logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, nargs="+", default=[262_144, 49_152])
    ap.add_argument("--tokens", type=int, default=300)
    args = ap.parse_args()
    for vocab in args.vocab:
        rows = model_like_logits(vocab, 16)
        history = list(np.random.default_rng(1).integers(0, vocab, 64))
        print(f"vocab {vocab}")
        for name, cfg in SETTINGS.items():
            sampler = Sampler(cfg)
            times = []
            for i in range(args.tokens):
                t = time.perf_counter()
                sampler.sample(rows[i % len(rows)], history)
                times.append(time.perf_counter() - t)
            print(f"  {name:32s} {statistics.median(times) * 1e6:8.0f} µs/token")


if __name__ == "__main__":
    main()
