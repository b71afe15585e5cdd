"""The CPU the kernels compile for: this machine's own, or a named x86-64 target.

Numba compiles for the host CPU unless told a CPU name and its features (NUMBA_CPU_NAME and
NUMBA_CPU_FEATURES); its cache keys every entry by both, so kernels compiled for a named target on one
machine load on any other machine that can run them. Fucina ships compiled kernels for the targets below
(kernels.common.shipped); the kernels that choose instructions by CPU feature (AVX2, AVX-512, VNNI) ask
`has` here, so they take the paths of the target compiled for, never more than it has.

FUCINA_KERNEL_TARGET picks the target: unset, the best shipped one this CPU runs, else the host; "host",
the host whatever is shipped; a target's name, that target (how shipped kernels are built).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable

import llvmlite.binding as llvm
import numba

ENV = "FUCINA_KERNEL_TARGET"
HOST = "host"


# what every x86-64 CPU has, as LLVM names it
_BASELINE = ("64bit", "cmov", "cx8", "fxsr", "mmx", "sse", "sse2", "x87")


@dataclass(frozen=True)
class Target:
    name: str
    llvm_cpu: str  # the LLVM CPU whose tuning its code gets; its instructions are `features` only
    features: tuple[str, ...]  # what the CPU must have; all the kernels may use

    def numba_features(self) -> str:
        """Every feature LLVM knows, on only where the target has it, so none the tuning CPU has besides
        (GFNI, VBMI, ...) slips into the code."""
        on = set(self.features) | set(_BASELINE)
        known = sorted(host_features()) or sorted(on)  # the host map names every feature LLVM knows
        return ",".join(("+" if f in on else "-") + f for f in known)


# x86-64-v3: the AVX2 level (Haswell, Zen 1 and later); x86-64-v4 adds AVX-512, and the int8 dot products
# pay with VNNI (Ice Lake, Zen 4 and later). Tuned as x86-64-v4 (Skylake-X), the integer GEMM of a prefill
# ran 15-20% slower on Zen 4 than tuned as Zen 4, with the same instructions (as fast as compiled for the
# host once tuned as Zen 4). x86-64-v3's tuning ran its AVX2 code within noise of Zen 3's, on Zen 4.
_V3 = ("sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "cx16", "sahf", "avx", "avx2", "bmi", "bmi2", "f16c",
       "fma", "lzcnt", "movbe", "xsave")
_V4 = _V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
TARGETS = (Target("x86-64-v4-vnni", "znver4", _V4 + ("avx512vnni",)),  # best first
           Target("x86-64-v3", "x86-64-v3", _V3))
BY_NAME = {t.name: t for t in TARGETS}


def host_features() -> dict[str, bool]:
    try:
        return dict(llvm.get_host_cpu_features())
    except RuntimeError:  # LLVM cannot tell on this platform
        return {}


def runs_here(target: Target) -> bool:
    host = host_features()
    return all(host.get(f) for f in target.features)


def choose(shipped: Iterable[str]) -> Target | None:
    """The target to compile for (None: the host), from FUCINA_KERNEL_TARGET and the shipped targets."""
    asked = os.environ.get(ENV, "").strip()
    if asked == HOST:
        return None
    if asked:
        if asked not in BY_NAME:
            raise ValueError(f"{ENV}={asked!r}: not a kernel target (targets: {', '.join(BY_NAME)}, {HOST})")
        return BY_NAME[asked]
    shipped = set(shipped)
    return next((t for t in TARGETS if t.name in shipped and runs_here(t)), None)


_chosen: Target | None = None


def compile_for(target: Target | None) -> None:
    """Make Numba compile for `target` (None: the host), before any kernel compiles. Set in the environment
    too: Numba rereads its settings from there at each compilation, and child processes inherit them."""
    global _chosen
    _chosen = target
    if target is not None:
        os.environ["NUMBA_CPU_NAME"] = target.llvm_cpu
        os.environ["NUMBA_CPU_FEATURES"] = target.numba_features()
    elif any(os.environ.get("NUMBA_CPU_FEATURES") == t.numba_features() for t in TARGETS):
        # inherited from a process that compiled for a target: this one compiles for the host
        os.environ.pop("NUMBA_CPU_NAME", None)
        os.environ.pop("NUMBA_CPU_FEATURES")
    numba.config.reload_config()


def chosen() -> Target | None:
    return _chosen


def has(feature: str) -> bool:
    """Whether the kernels may use `feature` (an LLVM name: "avx2", "avx512vnni"): the chosen target has
    it, or with none chosen, the host."""
    return feature in _chosen.features if _chosen is not None else bool(host_features().get(feature))


def describe() -> str:
    return _chosen.name if _chosen is not None else f"{HOST} ({llvm.get_host_cpu_name()})"
