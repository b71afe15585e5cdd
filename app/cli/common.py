"""What several commands share: the options naming the model they load and where it runs, opening it, and
the token counts their options take."""

from __future__ import annotations

import argparse
import sys

from app.cli.progress import ProgressBar
from engine.platform.catalog import default_model_name, resolve_model
from engine.history.validate import SAMPLER_RANGES
from engine.models import load_model
from engine.runtime import BACKENDS, configure_backend, configure_threads

MAX_TOKENS = int(SAMPLER_RANGES["ctx"][2])


def add_model_options(p, optional: bool = False) -> None:
    if optional:
        p.add_argument("model", nargs="?", default=None,
                       help="a starter model name or a path to a .gguf file (default: the default starter model)")
    else:
        p.add_argument("model", help="a starter model name or a path to a .gguf file")
    add_compute_options(p)
    add_kv_option(p)


def add_compute_options(p) -> None:
    """--threads and --backend: where and on how many threads the model a command loads runs."""
    p.add_argument("--threads", type=int, default=None, help="kernel threads (default: $FUCINA_THREADS or all cores)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="where the model runs (default auto: a CUDA GPU when present, Metal on macOS, else the CPU)")


def add_kv_option(p) -> None:
    p.add_argument("--kv", choices=["f16", "q8_0"], default="f16", help="KV cache type")


def configure_compute(args) -> int:
    """The kernel threads --threads asks for (their number) and the backend --backend names, for the models
    this command loads; the CPU, with one warning, when that backend cannot start."""
    threads = configure_threads(args.threads)
    configure_backend(args.backend, lambda message: print(f"warning: {message}", file=sys.stderr))
    return threads


def resolve_model_path(name: str):
    """A starter name or .gguf path -> the file; a starter model not yet downloaded is pulled first."""
    with ProgressBar() as bar:
        return resolve_model(name, pull_missing=True, progress=bar)


def open_model(args):
    configure_compute(args)
    model = load_model(resolve_model_path(args.model or default_model_name()))
    if getattr(args, "spec", False):  # asked for speculation: its verify kernels now, not after a reply or two
        model.rows_ready(model.new_cache(1, getattr(args, "kv", "f16")), wait=True)
    return model


def token_count(text: str) -> int:
    """A context or reply length: at least 1, at most what a stored conversation may hold (beyond it a typo
    would allocate the KV cache for it up front)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    if value > MAX_TOKENS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_TOKENS}, got {value}")
    return value
