"""When experts stream and what to expect (engine.models.expert_plan): a model too large for memory with its
experts mapped streams them into a cache sized from the memory free, and its outlook is its experts not held,
read at the rate the disk gave on them."""

import pytest

from engine.models import footprint, load_model
from engine.models.expert_plan import FREE_SHARE, PIN_SHARE, default_cache_bytes, outlook, streaming_options
from engine.models.footprint import RUNTIME_BYTES
from tests.moe_models import write_moe_model


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "moe.gguf"
    write_moe_model(path, "q4_k")
    return path


@pytest.fixture(scope="module")
def fp(moe_path):
    return footprint.file_footprint(moe_path)


def test_the_default_cache_is_a_share_of_the_memory_left_free_within_its_bounds(fp, monkeypatch):
    others = fp.weight_bytes - fp.expert_bytes
    monkeypatch.setattr(footprint, "machine_memory", lambda: 1 << 40)
    for free, expected in ((others + RUNTIME_BYTES + 1000, 800), (others, 0)):  # 0: one expert per layer
        monkeypatch.setattr("engine.models.expert_plan.available_memory", lambda: free)
        assert default_cache_bytes(fp) == min(fp.expert_bytes, expected)
    big = footprint.Footprint("x", 1, 1, 20 << 30, 16 << 30, 1 << 30)
    monkeypatch.setattr("engine.models.expert_plan.available_memory", lambda: 12 << 30)
    assert default_cache_bytes(big) == int(FREE_SHARE * ((12 << 30) - (4 << 30) - RUNTIME_BYTES))
    monkeypatch.setattr("engine.models.expert_plan.available_memory", lambda: 1 << 40)
    assert default_cache_bytes(big) == 16 << 30  # never more than every expert
    options = streaming_options(big)
    assert options.cache_bytes == 16 << 30 and options.pin_share == PIN_SHARE
    assert streaming_options(big, 5 << 20, policy="lru").cache_bytes == 5 << 20


def test_available_memory_is_meminfo_s_within_the_machine_s(tmp_path, monkeypatch):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 24000000 kB\nMemFree: 100 kB\nMemAvailable: 3000000 kB\n")
    monkeypatch.setattr(footprint, "machine_memory", lambda: 8 << 30)
    assert footprint.available_memory(tmp_path) == 3000000 * 1024
    monkeypatch.setattr(footprint, "machine_memory", lambda: 1 << 30)  # a cgroup's limit below it
    assert footprint.available_memory(tmp_path) == 1 << 30
    (tmp_path / "proc/meminfo").write_text("MemTotal: 24000000 kB\n")  # an old kernel: the machine's
    assert footprint.available_memory(tmp_path) == 1 << 30


def test_a_model_needs_streaming_only_when_its_experts_do_not_fit_mapped(fp, monkeypatch):
    others = fp.weight_bytes - fp.expert_bytes
    monkeypatch.setattr(footprint, "machine_memory", lambda: fp.needed_bytes)
    assert not footprint.needs_streaming(fp) and footprint.opens(fp)
    monkeypatch.setattr(footprint, "machine_memory", lambda: RUNTIME_BYTES + others + fp.expert_bytes // 2)
    assert footprint.needs_streaming(fp) and footprint.opens(fp)
    assert footprint.memory_verdict(fp).endswith("it does not fit, and its experts stream from disk")
    monkeypatch.setattr(footprint, "machine_memory", lambda: others)  # not even the other weights
    assert not footprint.opens(fp) and footprint.memory_verdict(fp).endswith("loading it is refused")
    dense = footprint.Footprint("qwen2", 1, 1, 10 << 30, 0, 0)
    assert not footprint.needs_streaming(dense) and not footprint.opens(dense)


def test_the_outlook_reads_a_token_s_experts_not_held_at_the_rate_measured_on_the_file(moe_path, fp):
    model = load_model(moe_path, experts=streaming_options(fp, fp.expert_bytes // 4))
    store = model.expert_store
    seen = outlook(model)
    assert seen.read_bytes_per_token == pytest.approx(fp.active_expert_bytes * 0.75, rel=1e-6)
    assert seen.read_rate > 0 and store.stats.bytes_read == 0  # the probe is not counted as the model's reads
    assert seen.tokens_per_s == pytest.approx(seen.read_rate / seen.read_bytes_per_token)
    assert seen.headline() == f"streams experts from disk: expect about {seen.tokens_per_s:.1f} tok/s"
    assert seen.note().startswith(seen.headline() + " (") and "MB read per token at" in seen.note()
    store.close()
    every = load_model(moe_path, experts=streaming_options(fp, fp.expert_bytes))
    held = outlook(every)
    assert held.read_bytes_per_token == 0 and held.headline() == "streams experts from disk"
    every.expert_store.close()
