"""A bounded load test of an OpenAI-compatible server on loopback: N streaming clients for S seconds.

    python benchmarks/bench_serve_load.py --url http://127.0.0.1:8080/v1 --clients 8 --seconds 60 [--api-key KEY]

Each client sends chat completions back to back (each one a different question, streamed, max_tokens
--max-tokens, temperature 0.8 with a per-request seed) until the time is up. It first runs one client
alone for the same time, then the N together, and prints JSON: requests, errors, completion tokens per
second over all clients, and p50/p99 time to first token (the first content chunk) for both runs. Any
server works: `fucina serve` or llama.cpp's `llama-server --parallel 8` on the same model and machine.
The exit status is 1 if any request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import httpx

QUESTIONS = ["What is the capital of {}?", "Write a haiku about {}.", "Explain {} to a child.",
             "List three facts about {}.", "Why is {} interesting?"]
TOPICS = ["France", "the sea", "rain", "volcanoes", "owls", "bread", "mathematics", "trains", "winter", "bees"]


def question(n: int) -> str:
    return QUESTIONS[n % len(QUESTIONS)].format(TOPICS[(n // len(QUESTIONS)) % len(TOPICS)])


async def one_request(client: httpx.AsyncClient, args, n: int) -> tuple[float, int]:
    """(seconds to the first content chunk, completion tokens) of one streamed chat completion."""
    body = {"model": args.model, "messages": [{"role": "user", "content": question(n)}], "stream": True,
            "max_tokens": args.max_tokens, "temperature": 0.8, "seed": n,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first, tokens, chunks = None, None, 0
    async with client.stream("POST", "/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"status {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices", []):
                if choice.get("delta", {}).get("content"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter() - start
    return (first if first is not None else time.perf_counter() - start), tokens if tokens is not None else chunks


async def run(args, clients: int) -> dict:
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    ttfts: list[float] = []
    tokens = errors = requests = 0
    counter = iter(range(10**9))
    deadline = time.perf_counter() + args.seconds

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal tokens, errors, requests
        while time.perf_counter() < deadline:
            try:
                ttft, n = await one_request(client, args, next(counter))
                ttfts.append(ttft)
                tokens += n
            except Exception as e:  # counted, and reported once
                errors += 1
                if errors == 1:
                    print(f"first error: {e}", flush=True)
            requests += 1

    start = time.perf_counter()
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=httpx.Timeout(300.0)) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
    elapsed = time.perf_counter() - start
    ttfts.sort()
    return {"clients": clients, "seconds": round(elapsed, 1), "requests": requests, "errors": errors,
            "completion_tokens": tokens, "tokens_per_s": round(tokens / elapsed, 2),
            "ttft_p50_ms": round(1e3 * statistics.median(ttfts), 1) if ttfts else None,
            "ttft_p99_ms": round(1e3 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 1) if ttfts else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8080/v1")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--api-key", default=None)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()
    alone = asyncio.run(run(args, 1))
    together = asyncio.run(run(args, args.clients))
    together["throughput_vs_one"] = round(together["tokens_per_s"] / alone["tokens_per_s"], 2) if alone["tokens_per_s"] else None
    print(json.dumps({"one": alone, "all": together}, indent=2))
    return 1 if alone["errors"] or together["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
