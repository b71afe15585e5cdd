"""`fucina install-desktop`: the desktop entry, the icons and the AppStream metadata, valid where the
validators are installed."""

import shutil
import subprocess

import pytest

from app.cli import main as fucina
from app.cli.desktop import APP_ID, PNG_SIZES, launcher


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("share")
    assert fucina(["install-desktop", "--prefix", str(prefix)]) == 0
    return prefix


def test_the_entry_starts_this_fucina_and_every_icon_size_is_rendered(installed):
    from PySide6.QtGui import QImage

    entry = (installed / "applications" / f"{APP_ID}.desktop").read_text()
    assert f"Exec={launcher()}\n" in entry and f"Icon={APP_ID}\n" in entry
    assert (installed / f"icons/hicolor/scalable/apps/{APP_ID}.svg").read_text().startswith("<svg")
    for size in PNG_SIZES:
        image = QImage(str(installed / f"icons/hicolor/{size}x{size}/apps/{APP_ID}.png"))
        assert (image.width(), image.height()) == (size, size)
        assert image.pixelColor(size // 2, size // 2).alpha() == 255  # drawn, not an empty canvas
    assert f"<id>{APP_ID}</id>" in (installed / "metainfo" / f"{APP_ID}.metainfo.xml").read_text()


@pytest.mark.parametrize("tool, args, path", [
    ("desktop-file-validate", [], f"applications/{APP_ID}.desktop"),
    ("appstreamcli", ["validate", "--no-net"], f"metainfo/{APP_ID}.metainfo.xml"),
])
def test_the_installed_files_pass_the_freedesktop_validators(installed, tool, args, path):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed (apt: desktop-file-utils, appstream)")
    run = subprocess.run([tool, *args, str(installed / path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_an_unwritable_prefix_is_one_error_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert fucina(["install-desktop", "--prefix", str(blocker / "share")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
