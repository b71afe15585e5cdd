"""Where Fucina keeps its data: `$FUCINA_HOME` when set (tests, portable installs), else the user data dir."""

import os
from pathlib import Path

import platformdirs


def data_dir() -> Path:
    home = os.environ.get("FUCINA_HOME")
    return Path(home).expanduser() if home else Path(platformdirs.user_data_dir("fucina", appauthor=False))


def cache_dir() -> Path:
    """Rebuildable per-machine data (measurements): `$FUCINA_HOME/cache` when set, else the user cache dir."""
    home = os.environ.get("FUCINA_HOME")
    return Path(home).expanduser() / "cache" if home else Path(platformdirs.user_cache_dir("fucina", appauthor=False))
