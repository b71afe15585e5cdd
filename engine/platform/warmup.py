"""Compile the kernels a model needs before its first reply (the first run).

Numba compiles a kernel at its first call and keeps the machine code in its on-disk cache; on a fresh
machine that made the first reply wait ~47 s. The warm-up does those first calls ahead, on a tiny model of
the same architecture and weight types (zero weights: only the shapes and types matter to the compiler),
so it can run while the real model is still downloading. It runs in child processes, one per stage: the
compiler holds the GIL, which would stall the app's window, and two stages use two cores. The prefill
stage is what the first token needs; the decode stage what every token after it needs; the verify stage,
started when those two have ended, what speculation needs (it is not waited for: replies decode plainly
until its kernels are in the cache).

A stage that finished leaves a mark in the kernel cache directory, which is named after the kernel
sources (kernels.common), so an edited kernel is compiled again.

A stage reports each kernel it compiles (`fucina warmup` prints a line per kernel, which the app reads
back); how far it is comes from the number its model's plan says it compiles on an empty cache
("compiles" in the catalog: what `fucina warmup NAME` printed last for each stage, on an empty
NUMBA_CACHE_DIR; a count that drifts with the kernels only makes the estimate coarser).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Callable, Iterable

import gguf
import numba
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba.core import event

import kernels.common  # noqa: F401 (names the kernel cache directory, which holds the marks)
from engine.platform.catalog import StarterModel, catalog
from engine.platform.child_process import popen_tied
from engine.errors import FucinaError
from engine.models import tiny
from engine.models.layout import MATRIX, NORM

STAGES = ("prefill", "decode")
# After those, not holding up the first reply: until it ends, speculation waits (replies decode plainly)
LATER_STAGES = ("verify",)
N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_LAYERS = 256, 4, 2, 256, 2  # 256: a K-quant block fits a row
# A prompt longer than the block kernels take (16 rows: it goes through the integer GEMM or BLAS), and long
# enough that norms, RoPE and the gated activation take their parallel paths (ops._PARALLEL_ELEMENTS: 128 rows
# of 256 values, and of the K heads' 128), as a real model's first prompt does; then one short enough for the
# block kernels. The long one first: the short one's products are the decode stage's too, which by then has
# compiled and cached them (the stages run side by side, and Numba looks in its cache first).
PROMPT_ROWS = (128, 3)
# the BPE merge kernels (SentencePiece runs the same ones) see a short and a long word
TEXT = "hi there, " + "x" * 80


def _byte_tokens() -> list[str]:
    """A byte-level BPE vocabulary: GPT-2's printable stand-ins for the 256 bytes, one merge."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    return [chr(c) for c in printable] + [chr(256 + i) for i in range(256 - len(printable))] + ["hi"]


VOCAB = len(_byte_tokens())


def _matrix(writer: gguf.GGUFWriter, name: str, qtype: T, rows: int, cols: int) -> None:
    if qtype == T.F32:
        writer.add_tensor(name, np.zeros((rows, cols), np.float32))
        return
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    writer.add_tensor(name, np.zeros((rows, cols // block_elems * block_bytes), np.uint8), raw_dtype=qtype)


def write_model(path: Path, plan: dict) -> None:
    """A tiny GGUF of the plan's architecture whose weights have the plan's types ("*": the default; a list
    alternates over the layers)."""
    arch, types = plan["arch"], plan["types"]

    def qtype(name: str) -> T:
        layer, kind = _kind(name)
        t = types.get(kind, types["*"])
        return T[t[layer % len(t)] if isinstance(t, list) else t]

    w = gguf.GGUFWriter(str(path), arch)
    meta = tiny.standard_metadata(arch, n_layers=N_LAYERS, n_embd=N_EMBD, n_head=N_HEAD, n_head_kv=N_HEAD_KV,
                                  n_ff=N_FF, vocab=VOCAB)
    tiny.write_metadata(w, meta)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(_byte_tokens())
    w.add_token_types([1] * VOCAB)
    w.add_token_merges(["h i"])
    for spec in tiny.tensors(arch, meta):
        if spec.role == MATRIX:
            if spec.required or _kind(spec.name)[1] in types:  # an untied output only where the plan has one
                _matrix(w, spec.name, qtype(spec.name), *spec.shape)
        else:  # norms of ones, zero biases
            w.add_tensor(spec.name, np.full(spec.shape, 1.0 if spec.role == NORM else 0.0, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _kind(name: str) -> tuple[int, str]:
    """A tensor's layer (0 outside the layers) and kind, as a plan names it: "blk.3.attn_q.weight" -> (3,
    "attn_q")."""
    parts = name.split(".")
    return (int(parts[1]), parts[2]) if parts[0] == "blk" else (0, parts[0])


def run_stage(plan: dict, stage: str) -> None:
    """The first calls of one stage, on a tiny model of the plan, in this process."""
    from engine.models import load_model
    from engine.tokenize import load_tokenizer

    with tempfile.TemporaryDirectory(prefix="fucina-warmup-") as tmp:
        path = Path(tmp) / "warmup.gguf"
        write_model(path, plan)
        model = load_model(path)
        try:
            cache = model.new_cache(sum(PROMPT_ROWS) + 8)
            if stage == "prefill":
                for rows in PROMPT_ROWS:
                    model.forward(list(range(rows)), cache)
                # last: the decode stage, running alongside, needs the long prompt's output product too
                load_tokenizer(model.file.metadata).encode(TEXT)
            elif stage == "decode":
                model.forward([1], cache)
            else:  # the verify forward's kernels (kernels compiled for many rows), saved to the kernel cache
                model.rows_ready(cache, wait=True)
        finally:
            model.file.close()


def _mark(name: str, stage: str) -> Path:
    return Path(numba.config.CACHE_DIR) / f"warm-{name}-{stage}"


def is_warm(model: StarterModel, stages: tuple[str, ...] = STAGES) -> bool:
    return all(_mark(model.name, stage).exists() for stage in stages)


class _Compiles(event.Listener):
    def __init__(self, on_compiled: Callable[[int], None]):
        self.count, self.on_compiled = 0, on_compiled

    def on_start(self, ev) -> None:
        self.count += 1
        self.on_compiled(self.count)

    def on_end(self, ev) -> None:
        pass


def counting_compiles(on_compiled: Callable[[int], None]) -> AbstractContextManager:
    """While inside: on_compiled(n) as the n-th kernel of this process starts compiling, on the thread that
    compiles it (a kernel loaded from the cache is not compiled)."""
    return event.install_listener("numba:compile", _Compiles(on_compiled))


def report_line(stage: str, kernel: int) -> str:
    """What `fucina warmup` prints as a stage's kernels compile (compiled_count reads it back)."""
    return f"{stage}: compiling kernel {kernel}"


def compiled_count(line: str) -> int | None:
    """The kernel's number in a report_line (the ones before it are compiled), else None."""
    stage, _, rest = line.strip().partition(": compiling kernel ")
    return int(rest) if stage in STAGES + LATER_STAGES and rest.isdigit() else None


def progress(model: StarterModel, compiled: dict[str, int], ended: Iterable[str]) -> float:
    """How far the stages the first reply waits for are, 0 to 1: the kernels each compiled of those its
    plan expects, a stage held short of its share until it ends."""
    expected = {stage: max(model.kernels.get("compiles", {}).get(stage, 1), 1) for stage in STAGES}
    ended = set(ended)
    done = sum(expected[s] if s in ended else min(compiled.get(s, 0), expected[s] - 1) for s in STAGES)
    return done / sum(expected.values())


def warm(name: str, stage: str, on_compiled: Callable[[int], None] | None = None) -> None:
    """`fucina warmup NAME --stage STAGE`: compile one stage for a starter model and leave its mark;
    `on_compiled` hears the count as each kernel compiles."""
    model = catalog().get(name)
    if model is None or not model.kernels:
        raise FucinaError(f"no kernel plan for {name!r}; starter models: {', '.join(catalog())}")
    with counting_compiles(on_compiled or (lambda _: None)):
        run_stage(model.kernels, stage)
    mark = _mark(name, stage)
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.touch()


def command(name: str, stage: str) -> list[str]:
    """The command line of one warm-up stage (a frozen app is its own interpreter)."""
    head = [sys.executable] if getattr(sys, "frozen", False) else [sys.executable, "-m", "app.cli"]
    return [*head, "warmup", name, "--stage", stage]


def start(name: str, env: dict | None = None, stages: tuple[str, ...] = STAGES) -> list[subprocess.Popen]:
    """The stages of a starter model's warm-up, each in a child process that dies with this one."""
    return [popen_tied(command(name, stage), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, env=env if env is not None else os.environ.copy())
            for stage in stages]
