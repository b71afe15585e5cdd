"""Kernels that arrive compiled (kernels/common/shipped.py, cpu_target.py): a cache built for a named target
in one place is found in another, compiles nothing there, and gives the bits compiling does."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from kernels.common import BUILD_ID, cpu_target, shipped
from tests.synthetic import write_tiny_model

ROOT = Path(__file__).resolve().parents[2]

# A child process: the project kernels it compiles, the target it compiled for, and a tiny model's logits
# through the prefill path (many rows: the integer GEMM) and a decode step (the row kernels).
FORWARD = """
import json, sys
import numpy as np
from numba.core import event

compiled = []

class Compiles(event.Listener):
    def on_start(self, ev):
        f = ev.data["dispatcher"].py_func
        if f.__module__.split(".")[0] in ("kernels", "engine"):  # not Numba's own helpers (typed lists)
            compiled.append(f.__qualname__)

    def on_end(self, ev):
        pass

event.register("numba:compile", Compiles())
from engine.models import load_model
from kernels.common import cpu_target

model = load_model(sys.argv[1])
cache = model.new_cache(64)
logits = np.concatenate([model.forward_all(list(range(1, 33)), cache), model.forward([7], cache)[None]])
np.save(sys.argv[2], logits)
print(json.dumps({"target": cpu_target.describe(), "compiled": compiled}))
"""


def _copy_sources(dst: Path) -> Path:
    """The project's engine and kernels, as an installation elsewhere has them: another path, new file
    times, no compiled caches."""
    for package in ("engine", "kernels"):
        shutil.copytree(ROOT / package, dst / package, copy_function=shutil.copyfile,
                        ignore=shutil.ignore_patterns("__pycache__", "compiled"))
    return dst


def _forward(project: Path, model: Path, out: Path, cache: Path, target: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU") and k != cpu_target.ENV}
    env |= {"PYTHONPATH": str(project), "NUMBA_CACHE_DIR": str(cache)} | ({cpu_target.ENV: target} if target else {})
    run = subprocess.run([sys.executable, "-c", FORWARD, str(model), str(out)], cwd=project, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_shipped_kernels_load_elsewhere_compile_nothing_and_give_the_same_bits(tmp_path):
    target = next((t for t in cpu_target.TARGETS if cpu_target.runs_here(t)), None)
    if target is None:
        pytest.skip("this CPU runs none of the shipped targets (it lacks AVX2)")
    model = tmp_path / "tiny.gguf"
    write_tiny_model(model, "llama", n_embd=256, n_ff=512, vocab=256, qtype=T.Q8_0)

    built = _forward(_copy_sources(tmp_path / "build"), model, tmp_path / "built.npy", tmp_path / "cache-a",
                     target.name)
    assert built["target"] == target.name and built["compiled"]

    installed = _copy_sources(tmp_path / "elsewhere" / "site-packages")
    shipped_dir = installed / "kernels" / "compiled"
    shutil.copytree(tmp_path / "cache-a" / target.name, shipped_dir / target.name,
                    ignore=shutil.ignore_patterns("*.lock"))
    shipped.write_manifest(shipped_dir, BUILD_ID, [target.name], {target.name: len(built["compiled"])})
    loaded = _forward(installed, model, tmp_path / "loaded.npy", tmp_path / "cache-b", None)

    assert loaded == {"target": target.name, "compiled": []}
    np.testing.assert_array_equal(np.load(tmp_path / "loaded.npy"), np.load(tmp_path / "built.npy"))


def _manifest(directory: Path, **changes) -> None:
    (directory / "x86-64-v3").mkdir(parents=True, exist_ok=True)
    shipped.write_manifest(directory, BUILD_ID, ["x86-64-v3"], {"x86-64-v3": 1})
    manifest = json.loads((directory / shipped.MANIFEST).read_text())
    manifest["built_with"] |= changes
    (directory / shipped.MANIFEST).write_text(json.dumps(manifest))


def test_a_shipped_cache_is_used_only_with_the_kernels_and_tools_it_was_built_with(tmp_path):
    _manifest(tmp_path)
    assert shipped.shipped_targets(BUILD_ID, tmp_path) == ["x86-64-v3"]
    assert shipped.shipped_targets("another-build", tmp_path) == []  # the kernels' sources changed
    _manifest(tmp_path, numba="0.1.0")
    assert shipped.shipped_targets(BUILD_ID, tmp_path) == []
    (tmp_path / shipped.MANIFEST).write_text("{not json")
    assert shipped.shipped_targets(BUILD_ID, tmp_path) == []
    assert shipped.shipped_targets(BUILD_ID, tmp_path / "absent") == []


def test_seeding_starts_a_cache_once_from_a_matching_build_and_leaves_one_that_exists_alone(tmp_path):
    source = tmp_path / "shipped"
    (source / "x86-64-v3" / "kernels_cpu").mkdir(parents=True)
    (source / "x86-64-v3" / "kernels_cpu" / "ops.nbi").write_bytes(b"index")
    cache = tmp_path / "cache" / "x86-64-v3"
    assert not shipped.seed("x86-64-v3", cache, BUILD_ID, source)  # no manifest: not a build of these kernels
    _manifest(source)
    assert not shipped.seed("x86-64-v3", cache, "another-build", source)  # a build of other kernel sources
    assert shipped.seed("x86-64-v3", cache, BUILD_ID, source)
    assert (cache / "kernels_cpu" / "ops.nbi").read_bytes() == b"index"
    (source / "x86-64-v3" / "kernels_cpu" / "ops.nbi").unlink()
    (source / "x86-64-v3" / "kernels_cpu" / "ops.nbi").write_bytes(b"newer")
    assert not shipped.seed("x86-64-v3", cache, BUILD_ID, source)  # a cache that has started keeps what it has
    assert (cache / "kernels_cpu" / "ops.nbi").read_bytes() == b"index"
    assert not shipped.seed("x86-64-v4-vnni", tmp_path / "cache" / "x86-64-v4-vnni", BUILD_ID, source)  # not shipped
    assert not list(tmp_path.glob("cache/.*"))  # nothing left aside


def test_the_target_is_the_best_shipped_one_this_cpu_runs(monkeypatch):
    monkeypatch.delenv(cpu_target.ENV, raising=False)
    avx2_only = {f: True for f in cpu_target.BY_NAME["x86-64-v3"].features}
    monkeypatch.setattr(cpu_target, "host_features", lambda: avx2_only)
    assert cpu_target.choose(["x86-64-v4-vnni", "x86-64-v3"]).name == "x86-64-v3"
    assert cpu_target.choose(["x86-64-v4-vnni"]) is None  # compile for the host
    assert cpu_target.choose([]) is None
    everything = {f: True for f in cpu_target.BY_NAME["x86-64-v4-vnni"].features}
    monkeypatch.setattr(cpu_target, "host_features", lambda: everything)
    assert cpu_target.choose(["x86-64-v3", "x86-64-v4-vnni"]).name == "x86-64-v4-vnni"
    monkeypatch.setenv(cpu_target.ENV, "host")
    assert cpu_target.choose(["x86-64-v3"]) is None
    monkeypatch.setenv(cpu_target.ENV, "x86-64-v3")
    assert cpu_target.choose([]).name == "x86-64-v3"  # how shipped kernels are built
    monkeypatch.setenv(cpu_target.ENV, "pentium")
    with pytest.raises(ValueError, match="not a kernel target"):
        cpu_target.choose([])
