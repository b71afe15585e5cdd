"""Missing Qt system libraries are found before Qt starts and named with the install command."""

import pytest

from app.gui import system_libraries as libs

LDD = """\tlinux-vdso.so.1 (0x00007ffd)
\tlibxcb-icccm.so.4 => not found
\tlibQt6Gui.so.6 => /opt/Qt/lib/libQt6Gui.so.6 (0x00007f35)
\tlibxcb-keysyms.so.1 => not found
\tlibxcb-icccm.so.4 => not found
"""


def test_ldd_output_gives_the_missing_sonames_once_each():
    assert libs.not_found(LDD) == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]


@pytest.mark.parametrize("os_release, manager", [
    ('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n', "apt"),
    ('ID=ubuntu\nID_LIKE=debian\n', "apt"),
    ('ID=linuxmint\nID_LIKE="ubuntu debian"\n', "apt"),
    ('ID=fedora\n', "dnf"),
    ('ID="rocky"\nID_LIKE="rhel centos fedora"\n', "dnf"),
    ('ID=manjaro\nID_LIKE=arch\n', "pacman"),
    ('ID=alpine\n', None),
])
def test_the_distribution_names_its_package_manager(os_release, manager):
    assert libs.package_manager(os_release) == manager


def test_the_install_command_names_each_distributions_packages():
    missing = ["libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1"]
    assert libs.install_hint(missing, "apt") == "sudo apt-get install -y libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1"
    assert libs.install_hint(missing, "dnf") == "sudo dnf install -y xcb-util-cursor xcb-util-wm xcb-util-keysyms"
    assert libs.install_hint(missing, "pacman") == ("sudo pacman -S --needed xcb-util-cursor xcb-util-wm "
                                                    "xcb-util-keysyms")
    assert "provide libfoo.so.1" in libs.install_hint(["libfoo.so.1"], "apt")
    assert "package manager" in libs.install_hint(missing, None)


def test_x11_is_checked_unless_another_platform_is_asked_for():
    assert libs.uses_x11({}) and libs.uses_x11({"QT_QPA_PLATFORM": "xcb"})
    assert not libs.uses_x11({"QT_QPA_PLATFORM": "offscreen"}) and not libs.uses_x11({"WAYLAND_DISPLAY": "wayland-0"})


def test_the_app_says_what_to_install_and_exits_2_instead_of_aborting(monkeypatch, capsys, tmp_path):
    from app.cli import main as fucina

    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    monkeypatch.setattr(libs, "missing_libraries", lambda: ["libxcb-cursor.so.0"])
    monkeypatch.setattr(libs, "package_manager", lambda os_release: "apt")
    assert fucina([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "libxcb-cursor.so.0" in err and "sudo apt-get install -y libxcb-cursor0" in err
