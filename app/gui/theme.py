"""The app's visual style: a light and a dark palette of our own (or the one the system prefers), a type
scale and spacing, applied Qt-natively as a QPalette plus one application style sheet.

Widgets name their part of the design with an object name or a dynamic property (`card="user"`,
`tone="muted"`...), and the style sheet below gives each its look; no widget sets colours itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QBoxLayout, QWidget

from app.gui import THEMES


# Type scale (points) and spacing (pixels): every size in the style sheet comes from these.
FONT_BODY, FONT_SMALL, FONT_TITLE = 10.5, 9.0, 20.0
SPACE_S, SPACE_M, SPACE_L, SPACE_XL = 4, 8, 16, 24
RADIUS_CARD, RADIUS_CONTROL = 12, 8
COLUMN_MAX_WIDTH_PX = 860  # the chat and the composer: lines of a readable length on a wide window


@dataclass(frozen=True)
class Colors:
    window: str      # the chat's background
    sidebar: str
    surface: str     # an assistant card, inputs, the header
    raised: str      # hover on a flat control
    border: str
    text: str
    muted: str
    accent: str      # the forge orange of the app icon
    on_accent: str
    user_card: str   # the user's messages sit on a tint of the accent
    user_border: str
    quote: str


LIGHT = Colors(window="#f7f7f8", sidebar="#eeeef1", surface="#ffffff", raised="#e7e7eb", border="#e1e1e6",
               text="#1f2328", muted="#6b7080", accent="#e8590c", on_accent="#ffffff", user_card="#fff3eb",
               user_border="#f6d4bf", quote="#f3f3f6")
DARK = Colors(window="#17181b", sidebar="#111214", surface="#202226", raised="#2c2f34", border="#2f3238",
              text="#e7e8ea", muted="#9a9fa8", accent="#ff8a3d", on_accent="#1a1208", user_card="#2b221c",
              user_border="#4a3527", quote="#26282d")


def system_prefers_dark() -> bool:
    return QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark


def colors_for(theme: str) -> Colors:
    """The colours of `theme` ("system" follows the system's light or dark preference)."""
    if theme not in THEMES:
        raise ValueError(f"theme {theme!r} is not one of {', '.join(THEMES)}")
    dark = theme == "dark" or (theme == "system" and system_prefers_dark())
    return DARK if dark else LIGHT


def palette_for(c: Colors) -> QPalette:
    """A full palette, so that widgets the style sheet does not name (dialogs, menus) match too."""
    palette = QPalette()
    roles = QPalette.ColorRole
    for role, value in [(roles.Window, c.window), (roles.WindowText, c.text), (roles.Base, c.surface),
                        (roles.AlternateBase, c.sidebar), (roles.Text, c.text), (roles.Button, c.surface),
                        (roles.ButtonText, c.text), (roles.Highlight, c.accent),
                        (roles.HighlightedText, c.on_accent), (roles.ToolTipBase, c.surface),
                        (roles.ToolTipText, c.text), (roles.PlaceholderText, c.muted), (roles.Link, c.accent),
                        (roles.Mid, c.border), (roles.Midlight, c.raised), (roles.Light, c.raised)]:
        palette.setColor(role, QColor(value))
    for role in (roles.WindowText, roles.Text, roles.ButtonText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(c.muted))
    return palette


def style_sheet(c: Colors) -> str:
    return f"""
QWidget {{ font-size: {FONT_BODY}pt; }}
QMainWindow, #chatPane, #chatColumn, #welcome {{ background: {c.window}; }}
QToolTip {{ background: {c.surface}; color: {c.text}; border: 1px solid {c.border}; padding: {SPACE_S}px; }}

#header {{ background: {c.window}; border-bottom: 1px solid {c.border}; }}
#sidebarPane {{ background: {c.sidebar}; border-right: 1px solid {c.border}; }}
#sidebarPane QListView {{ background: transparent; border: none; }}
#sidebarPane QListView::item {{ padding: 6px {SPACE_M}px; border-radius: 6px; }}
#sidebarPane QListView::item:selected {{ background: {c.raised}; color: {c.text}; }}

QLineEdit, QPlainTextEdit, QTextEdit, QComboBox, QSpinBox, QDoubleSpinBox {{
    background: {c.surface}; border: 1px solid {c.border}; border-radius: {RADIUS_CONTROL}px; padding: 5px;
    selection-background-color: {c.accent}; selection-color: {c.on_accent}; }}
QLineEdit:focus, QPlainTextEdit:focus {{ border-color: {c.accent}; }}
QPushButton {{ background: {c.surface}; border: 1px solid {c.border}; border-radius: {RADIUS_CONTROL}px;
    padding: 6px 14px; }}
QPushButton:hover {{ background: {c.raised}; }}
QPushButton:default, QPushButton[accent="true"] {{ background: {c.accent}; color: {c.on_accent};
    border-color: {c.accent}; }}
QToolButton {{ border: none; border-radius: 6px; padding: {SPACE_S}px; }}
QToolButton:hover {{ background: {c.raised}; }}
QToolButton:disabled {{ color: {c.muted}; }}
QToolButton#modelButton {{ font-weight: 600; padding: 5px 10px; }}
QToolButton#toolChoice {{ padding-right: 10px; }}
QToolButton#toolChoice::menu-indicator {{ subcontrol-origin: padding; subcontrol-position: center right;
    right: 2px; }}

QScrollArea {{ border: none; background: {c.window}; }}
QScrollBar:vertical {{ background: transparent; width: 10px; margin: 2px; }}
QScrollBar::handle:vertical {{ background: {c.border}; border-radius: 3px; min-height: 32px; }}
QScrollBar::handle:vertical:hover {{ background: {c.muted}; }}
QScrollBar::add-line, QScrollBar::sub-line, QScrollBar::add-page, QScrollBar::sub-page {{ height: 0; background: none; }}

QFrame[card="assistant"], QFrame[card="system"] {{ background: {c.surface}; border: 1px solid {c.border};
    border-radius: {RADIUS_CARD}px; }}
QFrame[card="user"] {{ background: {c.user_card}; border: 1px solid {c.user_border};
    border-radius: {RADIUS_CARD}px; }}
QFrame[found="true"] {{ border: 2px solid {c.accent}; }}
QFrame[card] QLabel {{ background: transparent; border: none; }}
QLabel#roleLabel {{ font-weight: 600; }}
QLabel[tone="muted"] {{ color: {c.muted}; font-size: {FONT_SMALL}pt; }}
QLabel#stoppedMark, QLabel#replyMark {{ color: {c.accent}; border: 1px solid {c.accent}; border-radius: 8px; padding: 0 6px;
    font-size: {FONT_SMALL}pt; }}
#thinkingBlock QToolButton {{ color: {c.muted}; padding: 2px 6px 2px 0; }}
QLabel#thinkingText {{ color: {c.muted}; border-left: 2px solid {c.border}; padding: 2px 0 2px 10px;
    font-size: {FONT_SMALL}pt; }}
QFrame#toolCallBlock {{ background: {c.surface}; border: 1px solid {c.border}; border-radius: {RADIUS_CONTROL}px; }}
QLabel#toolCallTitle {{ font-weight: 600; }}
QFrame#quote {{ background: {c.quote}; border: none; border-left: 3px solid {c.accent}; border-radius: 4px; }}
QLabel#math {{ font-family: "DejaVu Serif", "Cambria Math", serif; font-style: italic; font-size: 12pt; }}
QFrame#codeBlock {{ border: 1px solid {c.border}; border-radius: {RADIUS_CONTROL}px; }}

#composerBox {{ background: {c.surface}; border: 1px solid {c.border}; border-radius: 16px; }}
#composerBox QPlainTextEdit {{ border: none; background: transparent; padding: 2px; }}
QToolButton#sendButton, QToolButton#stopButton {{ background: {c.accent}; border-radius: 16px; }}
QToolButton#sendButton:disabled {{ background: {c.raised}; }}

#welcome QLabel#welcomeTitle {{ font-size: {FONT_TITLE}pt; font-weight: 600; }}
#welcome QPushButton {{ border-radius: {RADIUS_CARD}px; background: {c.surface}; }}
#welcome QLabel {{ background: transparent; }}
QLabel#exampleHeading {{ font-weight: 600; }}
#welcome QPushButton:hover {{ border-color: {c.accent}; }}
QStatusBar {{ background: {c.window}; color: {c.muted}; border-top: 1px solid {c.border}; }}
QStatusBar QLabel {{ color: {c.muted}; font-size: {FONT_SMALL}pt; padding: 2px {SPACE_M}px; }}
QSplitter::handle {{ background: {c.border}; }}
"""


def apply_theme(theme: str, app: QApplication | None = None) -> Colors:
    """Style the whole application in `theme`; widgets get a PaletteChange and re-render their own colours."""
    app = app or QApplication.instance()
    colors = colors_for(theme)
    app.setStyle("Fusion")  # the same metrics everywhere, and one that honours palettes and style sheets
    app.setPalette(palette_for(colors))
    app.setStyleSheet(style_sheet(colors))
    font = QFont(app.font())
    font.setPointSizeF(FONT_BODY)
    app.setFont(font)
    return colors


def centred(widget: QWidget, layout: QBoxLayout) -> None:
    """Add `widget` to the horizontal `layout`, COLUMN_MAX_WIDTH_PX at most, centred in what is left."""
    widget.setMaximumWidth(COLUMN_MAX_WIDTH_PX)
    layout.addStretch(1)
    layout.addWidget(widget, 1000)  # takes all it may; the stretches share the rest equally
    layout.addStretch(1)


def is_dark(widget: QWidget | None = None) -> bool:
    palette = widget.palette() if widget is not None else QApplication.palette()
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def repolish(widget: QWidget) -> None:
    """Apply the style sheet again after a dynamic property it selects on changed."""
    widget.style().unpolish(widget)
    widget.style().polish(widget)
