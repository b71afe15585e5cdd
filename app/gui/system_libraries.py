"""Qt's window-system plugin needs system libraries a minimal Linux lacks; without them Qt aborts the
process (SIGABRT) with a message few users can act on. This finds them before Qt starts and names the
command that installs them on this distribution. Qt itself is not imported here."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

# The X11 plugin links these, and Qt 6.5+ loads libxcb-cursor at run time (ldd cannot see that one).
DLOPENED = ("libxcb-cursor.so.0",)
# soname -> package per package manager (apt: Debian, Ubuntu; dnf: Fedora, RHEL; pacman: Arch)
PACKAGES = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor", "xcb-util-cursor"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm", "xcb-util-wm"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms", "xcb-util-keysyms"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image", "xcb-util-image"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil", "xcb-util-renderutil"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util", "xcb-util"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb", "libxcb"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb", "libxcb"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb", "libxcb"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb", "libxcb"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb", "libxcb"),
    "libxcb-xinput.so.0": ("libxcb-xinput0", "libxcb", "libxcb"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb", "libxcb"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb", "libxcb"),
    "libxcb.so.1": ("libxcb1", "libxcb", "libxcb"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb", "libx11"),
    "libX11.so.6": ("libx11-6", "libX11", "libx11"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11", "libxkbcommon-x11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon", "libxkbcommon"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl", "libglvnd"),
    "libGL.so.1": ("libgl1", "libglvnd-glx", "libglvnd"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl", "libglvnd"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig", "fontconfig"),
    "libfreetype.so.6": ("libfreetype6", "freetype", "freetype2"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs", "dbus"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2", "glib2"),
}
MANAGERS = {"apt": ("debian", "ubuntu"), "dnf": ("fedora", "rhel", "centos"), "pacman": ("arch",)}
INSTALL = {"apt": "sudo apt-get install -y", "dnf": "sudo dnf install -y", "pacman": "sudo pacman -S --needed"}


def not_found(ldd_output: str) -> list[str]:
    """The sonames ldd reports as "not found", in order, once each."""
    names = [line.split("=>")[0].strip() for line in ldd_output.splitlines() if "=> not found" in line]
    return list(dict.fromkeys(names))


def package_manager(os_release: str) -> str | None:
    """apt, dnf or pacman from /etc/os-release's ID and ID_LIKE; None when it names none of them."""
    fields = dict(line.split("=", 1) for line in os_release.splitlines() if "=" in line)
    ids = f"{fields.get('ID', '')} {fields.get('ID_LIKE', '')}".replace('"', "").split()
    return next((manager for manager, families in MANAGERS.items() if set(families) & set(ids)), None)


def install_hint(missing: list[str], manager: str | None) -> str:
    if manager is None:
        return f"install the packages that provide {', '.join(missing)} with your distribution's package manager"
    column = list(MANAGERS).index(manager)
    packages = dict.fromkeys(PACKAGES[name][column] for name in missing if name in PACKAGES)
    unknown = [name for name in missing if name not in PACKAGES]
    hint = f"{INSTALL[manager]} {' '.join(packages)}" if packages else ""
    if unknown:
        hint += f"{' and ' if hint else ''}the packages that provide {', '.join(unknown)}"
    return hint


def _qt_dir() -> Path | None:
    spec = importlib.util.find_spec("PySide6")
    return Path(next(iter(spec.submodule_search_locations))) / "Qt" if spec else None


def _ldd_missing(paths: list[Path]) -> list[str]:
    missing: list[str] = []
    for path in paths:
        try:
            run = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):  # no ldd (musl, a sandbox): let Qt try
            return []
        missing += not_found(run.stdout)
    return missing


def _loadable(soname: str) -> bool:
    try:
        ctypes.CDLL(soname)
    except OSError:
        return False
    return True


def uses_x11(environ=os.environ) -> bool:
    """Whether Qt will start its X11 plugin: asked for, or a desktop without Wayland."""
    platform = environ.get("QT_QPA_PLATFORM", "")
    return platform.startswith("xcb") or (not platform and not environ.get("WAYLAND_DISPLAY"))


def missing_libraries() -> list[str]:
    """The system libraries Qt needs here and cannot find (Linux only; elsewhere Qt ships its own)."""
    qt = _qt_dir()
    if not sys.platform.startswith("linux") or qt is None:
        return []
    paths = [qt / "lib" / "libQt6Gui.so.6"]
    if uses_x11():
        paths += [qt / "plugins" / "platforms" / "libqxcb.so", qt / "lib" / "libQt6XcbQpa.so.6"]
    missing = _ldd_missing([p for p in paths if p.exists()])
    if uses_x11():
        missing += [name for name in DLOPENED if not _loadable(name)]
    return list(dict.fromkeys(missing))


def problem() -> str | None:
    """What stops Qt from starting here, with the command that fixes it; None when nothing does."""
    missing = missing_libraries()
    if not missing:
        return None
    try:
        manager = package_manager(Path("/etc/os-release").read_text())
    except OSError:
        manager = None
    return (f"the desktop app needs system libraries this machine lacks ({', '.join(missing)}); "
            f"install them: {install_hint(missing, manager)}")
