"""What every backend shares, on the host: GGUF's formats read and written, and the Numba cache they compile in.

gguf_weights: a GGUF weight checked and decoded to float32 (the block decoders of quant_blocks for the native
formats, gguf.quants for the rest: quant_generic); what a device backend widens a format it has no kernel
for with. kv_rows: KV rows into their storage form (q8_0: GGML's block_q8_0). f16 and formats: Numba
building blocks of these and of the CPU backend's kernels.

Numba's on-disk cache checks only the source file of the function it caches, not the helpers it inlined from
other files, so an edited or upgraded helper could run stale machine code. The cache therefore lives in a
directory named after a hash of the sources of every kernel compiled into it (unless NUMBA_CACHE_DIR says
otherwise); it must be set before any kernel is decorated, hence here, in the package whose kernels every
backend imports first, as must the lock that keeps the cache whole when processes compile into it side by
side (cache_lock), the CPU the kernels compile for (cpu_target) and the locator that lets a cache compiled
elsewhere be found (shipped). Kernels compiled for a named target keep a cache of their own, in a folder
named after it, which starts as the shipped one where there is one.
"""

import hashlib
import os
from pathlib import Path

import numba
import platformdirs

from kernels.common import cache_lock, cpu_target, shipped

# The packages whose Numba kernels compile into the cache: these, and the CPU backend's, which inline them.
_CACHED_PACKAGES = ("common", "cpu")


def _sources_hash() -> str:
    h = hashlib.sha256()
    kernels_dir = Path(__file__).parent.parent
    for package in _CACHED_PACKAGES:
        for source in sorted((kernels_dir / package).glob("*.py")):
            h.update(f"{package}/{source.name}".encode() + b"\0" + source.read_bytes())
    return h.hexdigest()[:16]


# Names this build of the kernels' sources (a shipped cache is for one build only)
BUILD_ID = _sources_hash()


def _cache_dir(target: cpu_target.Target | None) -> Path:
    base = (Path(os.environ["NUMBA_CACHE_DIR"]) if os.environ.get("NUMBA_CACHE_DIR")
            else Path(platformdirs.user_cache_dir("fucina", appauthor=False)) / "numba" / BUILD_ID)
    if target is None:
        return base
    shipped.seed(target.name, base / target.name, BUILD_ID)  # a target asked for by name may have none shipped
    return base / target.name


TARGET = cpu_target.choose(shipped.shipped_targets(BUILD_ID))
cpu_target.compile_for(TARGET)
# Names the machine code in use, sources and target: what was measured of it (speculation's verify costs) is
# kept under it.
COMPILED_ID = BUILD_ID if TARGET is None else f"{BUILD_ID}-{TARGET.name}"
numba.config.CACHE_DIR = str(_cache_dir(TARGET))
shipped.install_locator()
cache_lock.install()
