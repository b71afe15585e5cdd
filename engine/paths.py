"""Where Fucina keeps its data: `$FUCINA_HOME` when set (tests, portable installs), else the user data dir."""

import os
from pathlib import Path

import platformdirs


def data_dir() -> Path:
    home = os.environ.get("FUCINA_HOME")
    return Path(home).expanduser() if home else Path(platformdirs.user_data_dir("fucina", appauthor=False))
