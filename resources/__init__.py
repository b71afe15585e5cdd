"""Data files shipped with Fucina: the starter-model catalog, style sheets, icons, templates."""

from pathlib import Path

_ROOT = Path(__file__).parent


def resource_path(name: str) -> Path:
    """The path of a resource file, e.g. `resource_path("models.json")`.

    Resources sit next to this module both in a checkout and in an installed (unzipped) package.
    """
    path = _ROOT / name
    if not path.is_file():
        raise FileNotFoundError(f"resource {name!r} is missing from {_ROOT}")
    return path


def read_text(name: str) -> str:
    """The contents of a text resource file (UTF-8)."""
    return resource_path(name).read_text(encoding="utf-8")
