"""`--backend`: where the models a command loads run."""

from __future__ import annotations

import sys

from engine.runtime import BACKENDS, configure_backend


def add_backend_option(p) -> None:
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="where the model runs (default auto: a CUDA GPU when present, Metal on macOS, else the CPU)")


def use_backend(args) -> None:
    """The backend --backend names, for the models this command loads; the CPU, with one warning, when it
    cannot start."""
    configure_backend(args.backend, lambda message: print(f"warning: {message}", file=sys.stderr))
