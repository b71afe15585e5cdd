"""The first run's kernel warm-up: a tiny model per starter plan that loads and runs both stages, and the
marks that keep it from running twice."""

import numba
import pytest

from engine.platform import warmup
from engine.platform.catalog import catalog
from engine.models import load_model


@pytest.mark.parametrize("name", list(catalog()))
def test_every_starter_plan_builds_a_tiny_model_of_its_architecture_and_types(name, tmp_path):
    from gguf import GGUFReader

    model = catalog()[name]
    path = tmp_path / "warm.gguf"
    warmup.write_model(path, model.kernels)
    reader = GGUFReader(str(path))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    assert arch == model.kernels["arch"]
    down = [t.tensor_type.name for t in reader.tensors if t.name.endswith("ffn_down.weight")]
    want = model.kernels["types"].get("ffn_down", model.kernels["types"]["*"])
    assert down == (want if isinstance(want, list) else [want] * len(down))
    load_model(path).file.close()  # it is a model the engine takes


def test_every_stage_runs_and_leaves_its_mark(tmp_path, monkeypatch):
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))  # the marks only: kernels keep their cache
    model = catalog()["smollm2-135m-instruct"]
    assert not warmup.is_warm(model)
    for stage in warmup.STAGES:
        warmup.warm(model.name, stage)
    assert warmup.is_warm(model) and not warmup.is_warm(model, warmup.LATER_STAGES)
    for stage in warmup.LATER_STAGES:
        warmup.warm(model.name, stage)
    assert warmup.is_warm(model, warmup.LATER_STAGES)


def test_warmup_of_an_unknown_model_is_a_clear_error(capsys):
    from app.cli import main as fucina

    assert fucina(["warmup", "no-such-model"]) == 2
    assert "no kernel plan for 'no-such-model'" in capsys.readouterr().err
    assert fucina(["bench", "no-such-model", "--cold-start"]) == 2
    assert "--cold-start measures a starter model" in capsys.readouterr().err


def test_after_the_stages_a_first_reply_compiles_nothing(tmp_path, monkeypatch, separate_decode_kernels):
    """A prompt longer than the block kernels take (the integer GEMM's path) and long enough for the parallel
    norms, RoPE and activation (a real model's first prompt takes them), then decode steps, then a verify of
    several rows: all compiled by the stages already, on a model of the plan (the warm-up used to miss the
    long prompt's, and then the parallel elementwise kernels)."""
    from numba.core import event

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    plan = catalog()["smollm2-135m-instruct"].kernels
    for stage in warmup.STAGES + warmup.LATER_STAGES:
        warmup.run_stage(plan, stage)
    warmup.write_model(tmp_path / "m.gguf", plan)
    model = load_model(tmp_path / "m.gguf")
    compiled = []

    class Compiles(event.Listener):
        def on_start(self, ev):
            compiled.append(ev.data["dispatcher"].py_func.__qualname__)

        def on_end(self, ev):
            pass

    with event.install_listener("numba:compile", Compiles()):
        cache = model.new_cache(200)
        model.forward(list(range(150)), cache)
        model.forward([7], cache)
        assert model.rows_ready(cache, wait=True)
        model.forward_rows([1, 2, 3, 4, 5, 6], cache)
    model.file.close()
    assert compiled == []


def test_a_stage_reports_each_kernel_it_compiles_and_its_progress_follows_the_plan():
    counts = []
    with warmup.counting_compiles(counts.append):
        numba.njit(lambda x: x + 1)(1)  # compiled: not in any cache
    assert counts == [1]
    line = warmup.report_line("prefill", 12)
    assert warmup.compiled_count(line) == 12 and warmup.compiled_count("some other output") is None
    model = catalog()["smollm2-135m-instruct"]
    expected = model.kernels["compiles"]
    total = expected["prefill"] + expected["decode"]
    assert warmup.progress(model, {}, ()) == 0
    assert warmup.progress(model, {"prefill": 12, "decode": 3}, ()) == 15 / total
    # a stage held short of its share until it ends (its count is an estimate), then all of it
    assert warmup.progress(model, {"prefill": 500}, ()) == (expected["prefill"] - 1) / total
    assert warmup.progress(model, {"prefill": 5}, ["prefill", "decode"]) == 1
