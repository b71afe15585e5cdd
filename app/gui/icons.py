"""The action icons: line-drawn SVGs under resources/icons/actions/, drawn in `currentColor` and tinted
here to the palette's text colour (or the accent's), so one file serves both themes."""

from __future__ import annotations

from functools import lru_cache

from PySide6.QtCore import QByteArray, QEvent, QSize, Qt
from PySide6.QtGui import QIcon, QPalette, QPixmap
from PySide6.QtWidgets import QToolButton, QWidget

from resources import read_text

ICON_SIZE = 18


@lru_cache(maxsize=None)
def _tinted(name: str, color: str) -> QIcon:
    svg = read_text(f"icons/actions/{name}.svg").replace("currentColor", color)
    pixmap = QPixmap()
    pixmap.loadFromData(QByteArray(svg.encode()), "SVG")
    return QIcon(pixmap)


def icon(name: str, widget: QWidget, role: QPalette.ColorRole = QPalette.ColorRole.ButtonText) -> QIcon:
    """The icon `name` in `widget`'s palette colour `role`."""
    return _tinted(name, widget.palette().color(role).name())


class IconButton(QToolButton):
    """A flat button showing an icon, with the accessible name and tooltip every icon button needs; its
    icon follows theme switches. `on_accent` buttons (Send, Stop) sit on the accent colour."""

    def __init__(self, name: str, accessible: str, tip: str, *, on_accent: bool = False, text: str = ""):
        super().__init__()
        self.icon_name, self._on_accent = name, on_accent
        self.setAccessibleName(accessible)
        self.setToolTip(tip)
        self.setAutoRaise(True)
        self.setIconSize(QSize(ICON_SIZE, ICON_SIZE))
        if text:  # an icon with a word beside it (Show more)
            self.setText(text)
            self.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self._tint()

    def set_icon_name(self, name: str) -> None:
        self.icon_name = name
        self._tint()

    def _tint(self) -> None:
        role = QPalette.ColorRole.HighlightedText if self._on_accent else QPalette.ColorRole.ButtonText
        self.setIcon(icon(self.icon_name, self, role))

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange:
            self._tint()
        super().changeEvent(event)
