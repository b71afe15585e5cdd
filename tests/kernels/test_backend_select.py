"""Choosing a backend: auto takes a device only when one is present, and a backend that cannot start falls
back to the CPU with one message."""

import types

import pytest

import kernels.backend as seam
from kernels.backend import BackendUnavailable, select_backend


def _module(present: bool, error: str | None = None):
    def create():
        if error:
            raise BackendUnavailable(error)
        return types.SimpleNamespace(name="cuda")
    return types.SimpleNamespace(device_present=lambda: present, create_backend=create)


@pytest.fixture
def modules(monkeypatch):
    """The backend modules select_backend finds, and a fresh record of the started ones."""
    found = {"cpu": seam._module("cpu")}

    def find(name):
        if name not in found:
            raise ImportError(f"No module named 'kernels.{name}.backend'")
        return found[name]

    monkeypatch.setattr(seam, "_started", {})
    monkeypatch.setattr(seam, "_module", find)
    return found


def test_auto_runs_on_the_cpu_without_a_device_and_says_nothing(modules):
    modules["cuda"] = _module(present=False)
    messages = []
    assert select_backend("auto", messages.append).name == "cpu"
    assert messages == []


def test_auto_takes_a_present_device(modules):
    modules["cuda"] = _module(present=True)
    assert select_backend("auto").name == "cuda"


def test_a_backend_that_cannot_start_falls_back_to_the_cpu_with_one_message(modules):
    modules["cuda"] = _module(present=True, error="no CUDA device or driver was found")
    messages = []
    assert select_backend("cuda", messages.append).name == "cpu"
    assert select_backend("cuda", messages.append).name == "cpu"  # started once: no second message
    assert messages == ["the cuda backend could not start, running on the CPU: no CUDA device or driver was found"]


def test_a_backend_not_installed_falls_back_naming_it(modules):
    messages = []
    assert select_backend("gpu", messages.append).name == "cpu"
    assert len(messages) == 1 and messages[0].startswith("the gpu backend could not start") \
        and "not installed" in messages[0]


def test_an_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        select_backend("tpu")
