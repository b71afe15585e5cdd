"""Kernels that arrive compiled: Numba's cache built ahead for named CPU targets, shipped in kernels/compiled/.

A wheel or bundle built after `python -m engine.platform.kernel_build` carries, per target of
kernels.common.cpu_target, the cache the starter models' warm-up fills when compiled for that target, and
a manifest of what it was built with. On a CPU that runs one of those targets, with the same kernel
sources, Numba, llvmlite, Python and platform, the kernels compile for that target and their cache starts
as the shipped one: a first reply compiles nothing. Anything else (another CPU, an edited kernel, another
Numba) compiles as before, for the host.

Numba's own locator names a cache directory after the absolute path of the source's folder, so a cache
built in one place is not found in another. Every cached kernel here is located by PortableLocator
instead: by its source's place in the project (kernels/cpu/ops.py -> "kernels_cpu") and stamped with the
source's content, so the same sources find the same entries in a checkout, a wheel or a bundle, wherever
installed and whatever the files' times.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shutil
import sys
from pathlib import Path

import llvmlite
import numba
from numba.core import config
from numba.core.caching import CacheImpl, UserProvidedCacheLocator

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "compiled"
MANIFEST = "manifest.json"
_PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the folder holding kernels/ and engine/


def built_with(build_id: str) -> dict:
    """What compiled kernels depend on besides the target: a shipped cache is used only where all match."""
    return {"kernels": build_id, "numba": numba.__version__, "llvmlite": llvmlite.__version__,
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "platform": f"{sys.platform}-{platform.machine()}"}


def shipped_targets(build_id: str, directory: Path = SHIPPED_DIR) -> list[str]:
    """The targets shipped in `directory` for exactly these kernel sources and tools (none if anything
    differs or nothing is shipped)."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(manifest, dict) or manifest.get("built_with") != built_with(build_id):
        return []
    return [t for t in manifest.get("targets", []) if isinstance(t, str) and (directory / t).is_dir()]


def write_manifest(directory: Path, build_id: str, targets: list[str], kernels: dict[str, int]) -> None:
    (directory / MANIFEST).write_text(json.dumps(
        {"built_with": built_with(build_id), "targets": targets, "kernels": kernels}, indent=1) + "\n")


def seed(target: str, cache_dir: Path, build_id: str, directory: Path = SHIPPED_DIR) -> bool:
    """Start the cache of `target` at `cache_dir` as the one shipped for these kernel sources and tools
    (shipped_targets), if it has not started yet (a cache directory that exists is used as it is). The copy
    is made aside and renamed into place, so a process never sees half of it; files are hard-linked where
    the file system allows (Numba replaces cache files, never writes into them)."""
    if cache_dir.exists() or target not in shipped_targets(build_id, directory):
        return False
    aside = cache_dir.parent / f".{cache_dir.name}.{os.getpid()}.seeding"
    try:
        cache_dir.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(directory / target, aside, copy_function=_link_or_copy)
        os.rename(aside, cache_dir)
        return True
    except OSError:  # another process seeded it first, or no space: compile as without shipped kernels
        shutil.rmtree(aside, ignore_errors=True)
        return False


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


@functools.lru_cache(maxsize=None)
def _content_hash(path: str, mtime: float, size: int) -> str:  # mtime and size: a changed file is hashed again
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class PortableLocator(UserProvidedCacheLocator):
    """Locates the cache of a kernel defined in the project by the source's place in the project and stamps
    it with the source's content (a frozen app's kernels included: their sources ship beside it)."""

    def __init__(self, py_func, py_file):
        super().__init__(py_func, py_file)
        place = Path(py_file).resolve().parent.relative_to(_PROJECT_ROOT)
        self._cache_path = os.path.join(config.CACHE_DIR, "_".join(place.parts))

    def get_source_stamp(self):
        st = os.stat(self._py_file)
        return _content_hash(str(Path(self._py_file).resolve()), st.st_mtime, st.st_size)

    @classmethod
    def from_function(cls, py_func, py_file):
        if not config.CACHE_DIR or not Path(py_file).resolve().is_relative_to(_PROJECT_ROOT):
            return None
        return super().from_function(py_func, py_file)


def install_locator() -> None:
    """Every kernel of the project cached by PortableLocator (before any kernel is decorated)."""
    if PortableLocator not in CacheImpl._locator_classes:
        CacheImpl._locator_classes.insert(0, PortableLocator)
