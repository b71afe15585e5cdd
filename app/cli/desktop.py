"""`fucina install-desktop [--prefix DIR]`: the Linux desktop entry, icons (SVG and PNG sizes) and
AppStream metadata, installed for this user (the XDG data directory) so Fucina appears among the
applications with its icon. The entry starts the `fucina` that runs this command."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from resources import resource_path

APP_ID = "org.fucina.Fucina"
PNG_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def data_home() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")


def launcher() -> str:
    """The command line that starts this Fucina: a frozen bundle is its own executable; else the `fucina`
    script beside this interpreter, or on PATH, or the interpreter running the package."""
    if getattr(sys, "frozen", False):
        return shlex.quote(sys.executable)
    script = Path(sys.executable).with_name("fucina")
    if script.is_file():
        return shlex.quote(str(script))
    found = shutil.which("fucina")
    return shlex.quote(found) if found else f"{shlex.quote(sys.executable)} -m app.cli"


def desktop_entry(command: str) -> str:
    lines = resource_path(f"desktop/{APP_ID}.desktop").read_text(encoding="utf-8").splitlines()
    return "\n".join(f"Exec={command}" if line.startswith("Exec=") else line for line in lines) + "\n"


def render_pngs(svg: Path, sizes=PNG_SIZES) -> dict[int, bytes]:
    """The icon at each size, rendered from its SVG (offscreen: no display needed)."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 (painting needs one)
    renderer = QSvgRenderer(str(svg))
    pngs = {}
    for size in sizes:
        image = QImage(size, size, QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        renderer.render(painter)
        painter.end()
        data = QByteArray()
        buffer = QBuffer(data)
        buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        image.save(buffer, "PNG")
        pngs[size] = bytes(data)
    return pngs


def install(prefix: Path) -> list[Path]:
    """Write the entry, the icons and the metadata under `prefix` (a share/ directory); the files."""
    svg = resource_path(f"icons/{APP_ID}.svg")
    metainfo = resource_path(f"desktop/{APP_ID}.metainfo.xml")
    files = {prefix / "applications" / f"{APP_ID}.desktop": desktop_entry(launcher()).encode(),
             prefix / "metainfo" / metainfo.name: metainfo.read_bytes(),
             prefix / "icons/hicolor/scalable/apps" / f"{APP_ID}.svg": svg.read_bytes()}
    for size, png in render_pngs(svg).items():
        files[prefix / f"icons/hicolor/{size}x{size}/apps" / f"{APP_ID}.png"] = png
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return list(files)


def run_install_desktop(args) -> int:
    from engine.platform.storage_errors import storage_error

    prefix = Path(args.prefix) if args.prefix else data_home()
    try:
        files = install(prefix)
    except OSError as e:  # a read-only or full data directory
        raise storage_error(e, prefix) from None
    print(f"installed the Fucina desktop entry, {len(files) - 2} icons and its AppStream metadata under {prefix}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("install-desktop", help="add Fucina to the desktop's applications (Linux)")
    p.add_argument("--prefix", default=None,
                   help="the share/ directory to install into (default: $XDG_DATA_HOME or ~/.local/share)")
    p.set_defaults(func=run_install_desktop)
