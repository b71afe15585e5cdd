"""`fucina bench --reopen`: the warm run prefills only the new turn, the cold run the whole conversation."""

from engine.benchmarks.reopen import reopen_benchmark


def test_the_reopen_benchmark_measures_a_warm_and_a_cold_reopen(model_path):
    r = reopen_benchmark(str(model_path("smollm2-135m-instruct")), 200, runs=1)
    n = r["conversation_tokens"]
    assert n >= 200
    assert r["warm_reused_tokens"] >= n - 1 and r["warm_prefilled_tokens"] < 30
    assert r["cold_prefilled_tokens"] >= n
    assert r["sidecar_bytes"] > n * r["sidecar_bytes_per_token"]
    assert r["warm_ttft_s"]["median"] > 0 and r["speedup"]["median"] > 0
