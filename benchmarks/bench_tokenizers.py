"""Tokenizer speed: build time and encode throughput, beside llama.cpp's tokenizer when it is installed.

    python benchmarks/bench_tokenizers.py [--repeat 3] [MODEL ...]

Corpora every CPython install carries: English prose (the `pydoc_data` help topics, ~0.5 MB) and code
(standard-library sources, ~1 MB). "cold" encodes with an empty word cache, "warm" encodes the same text
again; both on one core. llama.cpp (llama-cpp-python, the `peer` extra) runs on the same text.
Reports only: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.platform.catalog import catalog, resolve_model  # noqa: E402
from engine.gguf.reader import open_gguf  # noqa: E402
from engine.tokenize import load_tokenizer  # noqa: E402

CODE_BYTES = 1_000_000


def corpora() -> dict[str, str]:
    from pydoc_data.topics import topics

    prose = "\n\n".join(topics[k] for k in sorted(topics))
    code, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        if size >= CODE_BYTES:
            break
        code.append(path.read_text(encoding="utf-8", errors="replace"))
        size += len(code[-1].encode())
    return {"prose": prose, "code": "".join(code)}


def best_of(repeat: int, run) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def peer_tokenizer(path: Path):
    try:
        import llama_cpp
    except ImportError:
        return None
    llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    return lambda text: llm.tokenize(text.encode(), add_bos=True, special=True)


def bench(name: str, texts: dict[str, str], repeat: int) -> None:
    path = resolve_model(name)
    start = time.perf_counter()
    metadata = open_gguf(path).metadata
    read = time.perf_counter() - start
    build = best_of(repeat, lambda: load_tokenizer(metadata))
    tok = load_tokenizer(metadata)
    print(f"{name}: vocabulary {tok.vocab_size}, build {build * 1e3:.0f} ms (+ {read * 1e3:.0f} ms reading GGUF metadata)")
    peer = peer_tokenizer(path)
    for corpus, text in texts.items():
        mb = len(text.encode()) / 1e6

        def cold():
            tok.clear_cache()
            tok.encode(text)

        cold_s = best_of(repeat, cold)
        warm_s = best_of(repeat, lambda: tok.encode(text))
        line = f"  {corpus:5s} {mb:.2f} MB: cold {mb / cold_s:5.2f} MB/s, warm {mb / warm_s:5.2f} MB/s"
        if peer is not None:
            peer_s = best_of(repeat, lambda: peer(text))
            same = "ids identical" if peer(text) == tok.encode(text) else "IDS DIFFER"
            line += f"; llama.cpp {mb / peer_s:5.2f} MB/s (cold/llama.cpp {peer_s / cold_s:.2f}x, {same})"
        print(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=list(catalog()))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    texts = corpora()
    for name in args.models:
        bench(name, texts, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
