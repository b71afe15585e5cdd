import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli.progress import ProgressBar
from app.cli import main
from engine.platform import catalog
from engine.errors import ModelDownloadError

SMOL = "smollm2-135m-instruct"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    return tmp_path


def fake_download(name, verified=True):
    """Put a right-sized (sparse) file where a pull of `name` would, recorded as verified as a pull does."""
    model = catalog.catalog()[name]
    model.path().parent.mkdir(parents=True, exist_ok=True)
    with open(model.path(), "wb") as f:
        f.truncate(model.size)
    if verified:
        catalog.mark_verified(model)
    return model.path()


def test_list(home, capsys):
    fake_download(SMOL)
    assert main(["models", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("qwen2.5-coder-0.5b-instruct") and "downloaded" not in lines[0]  # the best replies first
    assert lines[1].startswith(SMOL + " *") and "downloaded" in lines[1] and "98 MB" in lines[1]
    assert str(home / "models") in lines[-1]


def test_list_json(home, capsys):
    fake_download("gemma-3-270m")
    assert main(["models", "list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert list(rows) == list(catalog.catalog())
    assert rows["gemma-3-270m"]["downloaded"] and not rows[SMOL]["downloaded"]
    assert rows[SMOL]["default"] and rows[SMOL]["size"] == 98362432


def test_path_of_downloaded_model_and_of_a_file(home, capsys):
    path = fake_download(SMOL)
    assert main(["models", "path", SMOL]) == 0
    assert capsys.readouterr().out.strip() == str(path)
    gguf = home / "x.gguf"
    gguf.write_bytes(b"GGUF")
    assert main(["models", "path", str(gguf)]) == 0
    assert capsys.readouterr().out.strip() == str(gguf)


def test_path_pulls_a_missing_model(home, capsys, monkeypatch):
    def pull(model, progress=None, cancel=None):
        progress(0, model.size, "downloading")
        progress(model.size, model.size, "verified")
        return fake_download(model.name)

    monkeypatch.setattr(catalog, "pull", pull)
    assert main(["models", "path", SMOL]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == str(catalog.catalog()[SMOL].path())
    assert "100.0%" in out.err


def test_pull_reports_progress_and_prints_the_path(home, capsys, monkeypatch):
    def pull(name, progress=None, verify=False):
        progress(0, 10_000_000, "downloading part 1/1")
        progress(10_000_000, 10_000_000, "verified")
        return home / "done.gguf"

    monkeypatch.setattr(catalog, "pull", pull)
    assert main(["models", "pull", SMOL]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == str(home / "done.gguf")
    assert "downloading part 1/1" in out.err and "10.0/10.0 MB" in out.err


def test_pull_of_downloaded_model_does_nothing(home, capsys, monkeypatch):
    fake_download(SMOL)
    monkeypatch.setattr(catalog, "pull", lambda *a, **k: pytest.fail("pulled again"))
    assert main(["models", "pull", SMOL]) == 0
    assert "already downloaded" in capsys.readouterr().err


def test_pull_of_a_model_changed_since_it_was_verified_pulls_again(home, capsys, monkeypatch):
    path = fake_download(SMOL)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    pulled = []
    monkeypatch.setattr(catalog, "pull", lambda name, progress=None, verify=False: pulled.append(name) or path)
    assert main(["models", "pull", SMOL]) == 0
    assert pulled == [SMOL] and "already downloaded" not in capsys.readouterr().err


def test_a_changed_model_is_refused_by_the_commands_that_use_it(home, capsys):
    path = fake_download(SMOL, verified=False)  # never verified, and not the real bytes
    assert main(["tokenize", SMOL, "--text", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path} has changed since it was downloaded")
    assert err.strip().endswith(f"run `fucina models pull {SMOL}` to download it again")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "error, status, message",
    [(ModelDownloadError("pip could not download x"), 2, "error: pip could not download x"), (KeyboardInterrupt(), 130, "cancelled")],
)
def test_pull_failures_exit_cleanly(home, capsys, monkeypatch, error, status, message):
    def pull(*a, **k):
        raise error

    monkeypatch.setattr(catalog, "pull", pull)
    assert main(["models", "pull", SMOL]) == status
    assert message in capsys.readouterr().err


def test_unknown_model_is_a_user_error(home, capsys):
    assert main(["models", "path", "bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no model 'bogus'") and SMOL in err


def test_progress_bar_redraws_one_line_on_a_terminal():
    stream = io.StringIO()
    stream.isatty = lambda: True
    with ProgressBar(stream) as bar:
        bar(0, 200_000_000, "downloading")
        bar(100_000_000, 200_000_000, "extracting")
    text = stream.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n")
    assert " 50.0%" in text and "100.0/200.0 MB" in text and "MB/s" in text


def test_runs_as_a_module(home):
    root = Path(__file__).parents[2]
    out = subprocess.run([sys.executable, "-m", "app.cli", "models", "list"], cwd=root, capture_output=True, text=True, check=True)
    assert SMOL in out.stdout
