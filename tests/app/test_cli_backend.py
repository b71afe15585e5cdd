"""`--backend`: a backend that cannot start leaves the command running on the CPU, with one warning."""

import types

import pytest

import engine.runtime
import kernels.backend as seam
from app.cli import main
from kernels.backend import BackendUnavailable
from tests.synthetic import write_tiny_model


def test_a_backend_that_cannot_start_warns_once_and_the_cpu_answers(tmp_path, monkeypatch, capsys):
    path = tmp_path / "tiny.gguf"
    write_tiny_model(path, "llama", tokenizer=True)
    assert main(["eval", str(path), "--ids", "1,2", "--backend", "cpu", "--json"]) == 0
    on_cpu = capsys.readouterr().out

    def no_device():
        raise BackendUnavailable("no CUDA device or driver was found")

    cuda = types.SimpleNamespace(device_present=lambda: False, create_backend=no_device)
    monkeypatch.setattr(seam, "_started", {})
    monkeypatch.setattr(seam, "_module", lambda name: cuda if name == "cuda" else seam.importlib.import_module(
        f"kernels.{name}.backend"))
    monkeypatch.setattr(engine.runtime, "_backend", None)
    assert main(["eval", str(path), "--ids", "1,2", "--backend", "cuda", "--json"]) == 0
    out = capsys.readouterr()
    assert out.err.splitlines() == ["warning: the cuda backend could not start, running on the CPU: "
                                    "no CUDA device or driver was found"]
    assert out.out == on_cpu


@pytest.mark.parametrize("command", ["generate", "eval", "chat", "serve", "bench"])
def test_every_model_command_takes_backend(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert "--backend {auto,cpu,cuda,gpu}" in capsys.readouterr().out
