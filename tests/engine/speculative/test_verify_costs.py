"""The verify-cost table is measured once per model, thread count and kernel build, then read back from the cache dir."""

import pytest

from engine.speculative import verify_costs


@pytest.fixture
def tiny_model(tmp_path_factory):
    from engine.models import load_model
    from tests.synthetic import write_tiny_model

    path = tmp_path_factory.mktemp("costs") / "tiny.gguf"
    write_tiny_model(path, "llama", vocab=64)
    return load_model(path)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    return tmp_path


def test_a_measurement_covers_every_verify_length(tiny_model):
    table = verify_costs.measure(tiny_model)
    assert sorted(table) == list(range(1, verify_costs.MAX_ROWS + 1)) and all(s > 0 for s in table.values())


def test_the_table_is_measured_once_and_read_back_by_the_next_process(tiny_model, home, monkeypatch):
    calls = []
    fake = {m: 0.01 * m for m in range(1, verify_costs.MAX_ROWS + 1)}
    monkeypatch.setattr(verify_costs, "measure", lambda model: calls.append(model) or dict(fake))
    assert verify_costs.verify_cost_table(tiny_model) == fake
    assert verify_costs.verify_cost_table(tiny_model) == fake and len(calls) == 1
    [stored] = (home / "cache" / "verify-costs").iterdir()

    verify_costs._MEASURED.clear()  # a new process: the file answers
    assert verify_costs.verify_cost_table(tiny_model) == fake and len(calls) == 1

    verify_costs._MEASURED.clear()
    stored.write_text('{"seconds": {"1": 0.5}}')  # damaged or from an older layout: measured again
    assert verify_costs.verify_cost_table(tiny_model) == fake and len(calls) == 2
    assert verify_costs._read(stored) == fake


def test_new_kernels_measure_again(tiny_model, monkeypatch):
    calls = []
    monkeypatch.setattr(verify_costs, "measure", lambda model: calls.append(model) or {m: 0.01 * m for m in
                                                                                  range(1, verify_costs.MAX_ROWS + 1)})
    verify_costs.verify_cost_table(tiny_model)
    verify_costs._MEASURED.clear()
    monkeypatch.setattr(verify_costs, "KERNELS_BUILD", "another-build")  # the kernels' sources changed
    verify_costs.verify_cost_table(tiny_model)
    assert len(calls) == 2  # the old build's costs are not this build's
