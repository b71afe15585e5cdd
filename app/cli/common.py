"""What several commands share: the options naming the model they load and where it runs, opening it, and
the token counts their options take."""

from __future__ import annotations

import argparse
import sys

from app.cli.progress import ProgressBar
from engine.platform.catalog import default_model_name, resolve_model
from engine.errors import FucinaError
from engine.history.validate import SAMPLER_RANGES
from engine.models import load_model
from engine.models.expert_plan import outlook, streaming_plan
from engine.models.expert_store import PIN_SHARE
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
    add_stream_options(p)


def add_compute_options(p) -> None:
    """--threads and --backend: where and on how many threads the model a command loads runs."""
    p.add_argument("--threads", type=int, default=None, help="kernel threads (default: $FUCINA_THREADS or all cores)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="where the model runs (default auto: a CUDA GPU when present, Metal on macOS, else the CPU)")


def add_stream_options(p) -> None:
    """--moe-stream, --moe-cache-mb, --moe-lru, --moe-no-pin, --moe-prefetch, --moe-io-threads, --moe-trace: a
    Mixture-of-Experts model's experts read from disk on demand into a cache (engine.models.expert_store)
    instead of mapped."""
    p.add_argument("--moe-stream", action="store_true",
                   help="read the experts from disk on demand into a cache (default: most of the memory free; a model "
                        "too large for memory with its experts mapped streams them anyway)")
    p.add_argument("--moe-cache-mb", type=int, metavar="MB", default=None,
                   help="stream the experts into a cache of this many MB (implies --moe-stream)")
    p.add_argument("--moe-lru", action="store_true", help="evict the least recently used expert, not the coldest")
    p.add_argument("--moe-no-pin", action="store_true",
                   help="do not keep half of each layer's cache for its most routed experts in earlier runs (learned "
                        "beside the model, in MODEL.gguf.experts)")
    p.add_argument("--moe-prefetch", action="store_true",
                   help="while a layer computes, read the experts the next layer's router would pick for its input")
    p.add_argument("--moe-io-threads", type=int, metavar="N", default=4,
                   help="read a call's missing experts N at a time (default 4)")
    p.add_argument("--moe-trace", metavar="PATH", default=None,
                   help="record the routed experts in order and save them at exit (fucina experts replay PATH)")


def stream_plan(args):
    """load_model's `experts` for the --moe-* options: streamed where they ask for it, or where a model file too
    large for this machine's memory with its experts mapped needs it (into the default cache); else mapped."""
    stream, mb, lru, trace, no_pin, prefetch = (getattr(args, name, None) for name in (
        "moe_stream", "moe_cache_mb", "moe_lru", "moe_trace", "moe_no_pin", "moe_prefetch"))
    if mb is not None and mb < 1:
        raise FucinaError(f"--moe-cache-mb must be at least 1, got {mb}")
    io_threads = getattr(args, "moe_io_threads", 4)
    if io_threads < 1:
        raise FucinaError(f"--moe-io-threads must be at least 1, got {io_threads}")
    asked = bool(stream or mb is not None or lru or trace or prefetch)
    return streaming_plan(None if mb is None else mb << 20, always=asked, policy="lru" if lru else "heat",
                          trace=bool(trace), io_threads=io_threads, pin_share=0.0 if no_pin else PIN_SHARE,
                          prefetch=bool(prefetch))


# (model, its command's args) of each model a command opened with streamed experts, for report_streams
_STREAMED: list[tuple] = []


def report_streams() -> None:
    """After a command: what each model it streamed experts for read and hit, and the traces --moe-trace asked
    for."""
    while _STREAMED:
        model, args = _STREAMED.pop()
        store = model.expert_store
        s = store.stats
        pins = f", {s.pinned} pinned" + (f" ({s.pins_declined} layers' usage too flat to pin)"
                                          if s.pins_declined else "") if s.pinned or s.pins_declined else ""
        ahead = f", {s.prefetch_used} of {s.prefetched} read ahead routed to" if s.prefetched else ""
        print(f"experts streamed: {s.hits + s.misses} routed, hit rate {s.hit_rate:.1%}, "
              f"{s.bytes_read / 1e6:.1f} MB read{pins}{ahead}", file=sys.stderr)
        try:  # what pins the next run's experts
            store.save_usage()
        except OSError as e:
            print(f"warning: the experts' usage was not saved beside the model: {e.strerror}", file=sys.stderr)
        if store.trace is not None:
            try:
                store.trace.save(args.moe_trace)
            except OSError as e:
                print(f"warning: the experts trace was not saved to {args.moe_trace}: {e.strerror}", file=sys.stderr)
                continue
            print(f"experts trace: {args.moe_trace} ({len(store.trace.calls)} calls)", file=sys.stderr)


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
    path = resolve_model_path(args.model or default_model_name())
    model = load_model(path, experts=stream_plan(args))
    if getattr(model, "expert_store", None) is not None:  # what it read, after the command
        _STREAMED.append((model, args))
        print(f"{path.name} {outlook(model).note()}", file=sys.stderr)
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
