"""`python -m engine.platform.kernel_build [OUT]`: compile the kernels Fucina ships (kernels.common.shipped).

For each target of kernels.common.cpu_target that this CPU runs, every starter model's warm-up stages
(engine.platform.warmup) run compiled for that target into an empty kernel cache, which is then copied to
OUT (default: kernels/compiled/, where a wheel or the bundle takes it from) with a manifest. Kernels
compile as they are first called, so a target is built only on a CPU that runs it: a machine without
AVX-512 builds the AVX2 target alone. The warm-up marks go with the cache, so an installation that starts
from it has no warm-up to run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from engine.errors import FucinaError
from engine.platform import warmup
from engine.platform.catalog import catalog
from kernels.common import BUILD_ID, cpu_target, shipped


def build(out: Path = shipped.SHIPPED_DIR, targets: Sequence[str] | None = None,
          models: Sequence[str] | None = None, log: Callable[[str], None] = print) -> dict[str, int]:
    """Build the shipped kernels into `out` (replacing what is there); the kernels compiled per target."""
    chosen = [t for t in cpu_target.TARGETS if targets is None or t.name in targets]
    runnable = [t for t in chosen if cpu_target.runs_here(t)]
    for t in chosen:
        if t not in runnable:
            log(f"{t.name}: skipped, this CPU cannot run it (it lacks "
                f"{', '.join(f for f in t.features if not cpu_target.host_features().get(f))})")
    models = list(models) if models is not None else [name for name, m in catalog().items() if m.kernels]
    compiled: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="fucina-kernels-") as tmp:
        cache, staged = Path(tmp) / "cache", Path(tmp) / "compiled"
        staged.mkdir()
        for target in runnable:
            env = {**os.environ, cpu_target.ENV: target.name, "NUMBA_CACHE_DIR": str(cache)}
            for name in models:
                for stage in warmup.STAGES + warmup.LATER_STAGES:
                    _run_stage(name, stage, env)
            shutil.copytree(cache / target.name, staged / target.name, ignore=shutil.ignore_patterns("*.lock"))
            # compiled signatures, one data file each (a cache seeded from an earlier build of the same
            # sources holds them too: what is counted is what ships)
            compiled[target.name] = sum(1 for _ in (staged / target.name).rglob("*.nbc"))
            log(f"{target.name}: {compiled[target.name]} kernels, {_size_mb(staged / target.name):.1f} MB")
        shipped.write_manifest(staged, BUILD_ID, list(compiled), compiled)
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(staged, out)
    return compiled


def _run_stage(name: str, stage: str, env: dict) -> None:
    """One warm-up stage in a child process."""
    run = subprocess.run(warmup.command(name, stage), env=env, stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, check=False)
    if run.returncode != 0:
        raise FucinaError(f"compiling {name}'s {stage} kernels failed: {run.stderr.strip()[-2000:]}")


def _size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m engine.platform.kernel_build", description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", type=Path, default=shipped.SHIPPED_DIR)
    parser.add_argument("--target", action="append", choices=list(cpu_target.BY_NAME),
                        help="a target to build (repeatable; default: every target this CPU runs)")
    parser.add_argument("--model", action="append", help="a starter model to build for (default: all)")
    args = parser.parse_args(argv)
    compiled = build(args.out, args.target, args.model)
    if not compiled:  # a bundle or wheel built here still works: its kernels compile on first use
        print("warning: this CPU runs none of the kernel targets; no compiled kernels to ship", file=sys.stderr)
        return
    print(f"shipped kernels: {', '.join(compiled)} in {args.out} ({_size_mb(args.out):.1f} MB)")


if __name__ == "__main__":
    main()
