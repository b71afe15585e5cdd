"""Light and dark follow the system palette; the few colours of our own derive from it."""

from __future__ import annotations

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QWidget


def is_dark(widget: QWidget | None = None) -> bool:
    palette = widget.palette() if widget is not None else QApplication.palette()
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def bubble_color(widget: QWidget, role: str) -> QColor:
    """User messages sit on a tint of the highlight colour, replies on the plain base colour."""
    palette = widget.palette()
    base = palette.color(QPalette.ColorRole.Base)
    if role != "user":
        return base
    accent = palette.color(QPalette.ColorRole.Highlight)
    mix = 0.18
    return QColor.fromRgbF(*(b * (1 - mix) + a * mix for b, a in zip(base.getRgbF()[:3], accent.getRgbF()[:3])))
