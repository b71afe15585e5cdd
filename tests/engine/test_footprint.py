"""A model's footprint read from its header (engine/models/footprint.py): parameters in all and per token,
and a refusal before loading where this machine's memory cannot hold the weights."""

import json
import math

import pytest

from engine.errors import ModelTooLarge
from engine.gguf.reader import open_gguf
from engine.models import footprint, load_model, validate
from tests.moe_models import N_EXPERT, N_USED, write_moe_model


@pytest.fixture(scope="module")
def moe_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("footprint") / "moe.gguf"
    write_moe_model(path, "q8_0")
    return path


def test_a_moe_model_counts_k_of_its_n_experts_per_token(moe_file):
    with open_gguf(moe_file) as f:
        fp = footprint.footprint(f)
        sizes = {info.name: (math.prod(info.shape), info.nbytes) for info in f.tensors.values()}
    experts = sum(n for name, (n, _) in sizes.items() if "_exps." in name)
    assert experts and fp.family == "qwen3moe"
    assert fp.parameters == sum(n for n, _ in sizes.values())
    assert fp.active_parameters == fp.parameters - experts + experts * N_USED // N_EXPERT
    assert fp.weight_bytes == sum(b for _, b in sizes.values())
    assert 0 < fp.expert_bytes < fp.weight_bytes
    assert fp.active_expert_bytes == sum(b for name, (_, b) in sizes.items() if "_exps." in name) * N_USED // N_EXPERT
    assert "per token" in footprint.describe(fp)


def test_a_moe_decode_step_reads_k_of_n_experts_bytes(moe_file):
    from engine.benchmarks.bandwidth import weight_bytes_per_token

    with open_gguf(moe_file) as f:
        fp = footprint.footprint(f)
        assert "output.weight" not in f.tensors  # tied: the output product reads the whole embedding table
    assert weight_bytes_per_token(moe_file) == fp.weight_bytes - fp.expert_bytes + fp.active_expert_bytes


def test_a_model_this_machine_cannot_hold_is_refused_before_its_file_is_read(moe_file, monkeypatch):
    monkeypatch.setattr(footprint, "machine_memory", lambda: footprint.RUNTIME_BYTES)
    monkeypatch.setattr(validate, "first_non_finite", lambda file: pytest.fail("the file was scanned"))
    with pytest.raises(ModelTooLarge, match=r"needs about 1\.\d GB of memory .* this machine has 1\.1 GB"):
        load_model(moe_file)


def test_models_info_says_whether_a_file_fits(moe_file, monkeypatch, capsys):
    from app.cli import main

    main(["models", "info", str(moe_file), "--json"])
    info = json.loads(capsys.readouterr().out)
    assert info["family"] == "qwen3moe" and info["active_parameters"] < info["parameters"]
    assert info["fits"] is (info["machine_memory"] is None or info["needed_bytes"] <= info["machine_memory"])
    monkeypatch.setattr(footprint, "machine_memory", lambda: 10**9)
    main(["models", "info", str(moe_file)])
    assert "it does not fit, and loading it is refused" in capsys.readouterr().out


def test_models_info_says_what_a_token_of_context_takes_in_the_kv_cache(moe_file, tmp_path, capsys):
    """A deepseek2 model caches one latent row of 80 values a layer; qwen3moe a key and a value per KV head."""
    from app.cli import main
    from tests.moe_models import DEEPSEEK2_SHAPE, write_deepseek2_model

    latent = tmp_path / "deepseek2.gguf"
    write_deepseek2_model(latent)
    main(["models", "info", str(latent), "--json"])
    row = DEEPSEEK2_SHAPE["kv_lora_rank"] + DEEPSEEK2_SHAPE["rope"]
    assert json.loads(capsys.readouterr().out)["kv_bytes_per_token"] == 3 * row * 2
    main(["models", "info", str(moe_file), "--json"])
    assert json.loads(capsys.readouterr().out)["kv_bytes_per_token"] == 2 * 2 * 2 * 64 * 2  # layers, K and V, heads
    main(["models", "info", str(latent)])
    assert f"KV cache: {3 * row * 2 / 1024:.1f} KB per token of context (f16)" in capsys.readouterr().out


def test_models_info_says_whether_speculation_drafts_from_the_models_own_mtp_layer(moe_file, tmp_path, capsys):
    from app.cli import main
    from tests.moe_models import write_glm4moe_model

    with_layer, part = tmp_path / "mtp.gguf", tmp_path / "part.gguf"
    write_glm4moe_model(with_layer, next_token=True)
    write_glm4moe_model(part, next_token=True, skip_tensors=("blk.3.nextn.eh_proj.weight",))
    for path, expected in ((with_layer, True), (part, False), (moe_file, False)):
        main(["models", "info", str(path), "--json"])
        assert json.loads(capsys.readouterr().out)["next_token_layer"] is expected
    main(["models", "info", str(with_layer)])
    assert "next-token prediction (MTP) layer: speculative replies draft from it" in capsys.readouterr().out


def test_a_model_too_large_mapped_loads_with_its_experts_streamed_into_a_cache_that_fits(moe_file, monkeypatch):
    from engine.models.expert_store import StreamOptions

    with open_gguf(moe_file) as f:
        fp = footprint.footprint(f)
    others = fp.weight_bytes - fp.expert_bytes
    monkeypatch.setattr(footprint, "machine_memory", lambda: footprint.RUNTIME_BYTES + others + fp.expert_bytes // 2)
    with pytest.raises(ModelTooLarge, match=r"or stream its experts from disk \(--moe-stream\)"):
        load_model(moe_file)
    model = load_model(moe_file, experts=StreamOptions(cache_bytes=fp.expert_bytes // 4))
    assert model.expert_store is not None
    with pytest.raises(ModelTooLarge, match="with its experts streamed into a cache of .* choose a smaller cache"):
        load_model(moe_file, experts=StreamOptions(cache_bytes=fp.expert_bytes))


def test_the_machine_memory_counts_a_cgroup_v1_or_v2_limit(tmp_path):
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("9:name=systemd:/\n4:memory:/bench/run\n0::/\n")
    v1 = tmp_path / "sys/fs/cgroup/memory/bench/run"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert footprint._cgroup_limit(tmp_path) is None
    (v1 / "memory.limit_in_bytes").write_text(f"{8 << 30}\n")
    assert footprint._cgroup_limit(tmp_path) == 8 << 30
    (tmp_path / "sys/fs/cgroup/memory.max").write_text(f"{4 << 30}\n")  # v2 first
    assert footprint._cgroup_limit(tmp_path) == 4 << 30
    (tmp_path / "sys/fs/cgroup/memory.max").write_text("max\n")
    assert footprint._cgroup_limit(tmp_path) == 8 << 30
