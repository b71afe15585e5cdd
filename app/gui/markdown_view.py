"""A message body: Markdown prose rendered by Qt (with `$…$` math as Unicode), code blocks with highlighting
and a copy button, block quotes beside an accent bar, display math on a line of its own.

`set_markdown` may be called many times a second while a reply streams: it updates the existing segment
widgets in place and only replaces the ones whose kind changed, so the view neither flickers nor jumps.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from app.gui.highlight import code_background, highlight_html
from app.gui.icons import IconButton
from app.gui.markdown_segments import Segment, split_markdown
from app.gui.tex import inline_math_as_markdown, tex_to_unicode
from app.gui.theme import is_dark

SELECTABLE = Qt.TextInteractionFlag.TextSelectableByMouse | Qt.TextInteractionFlag.LinksAccessibleByMouse


class ProseLabel(QLabel):
    """Headings, lists, tables, emphasis and links through Qt's own Markdown (GitHub dialect) renderer."""

    kind = "prose"

    def __init__(self):
        super().__init__()
        self.setTextFormat(Qt.TextFormat.MarkdownText)
        self.setWordWrap(True)
        self.setTextInteractionFlags(SELECTABLE)
        self.setOpenExternalLinks(True)

    def show_segment(self, segment: Segment) -> None:
        text = inline_math_as_markdown(segment.text)
        if text != self.text():
            self.setText(text)


class QuoteBlock(QFrame):
    """A block quote: its prose on a tinted panel with the accent bar on the left (the style sheet's)."""

    kind = "quote"

    def __init__(self):
        super().__init__()
        self.setObjectName("quote")
        self.prose = ProseLabel()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 6, 10, 6)
        layout.addWidget(self.prose)

    def show_segment(self, segment: Segment) -> None:
        self.prose.show_segment(segment)


class MathBlock(QLabel):
    """Display math (`$$…$$`): its Unicode form, centred in a serif italic."""

    kind = "math"

    def __init__(self):
        super().__init__()
        self.setObjectName("math")
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.setWordWrap(True)
        self.setTextInteractionFlags(SELECTABLE)

    def show_segment(self, segment: Segment) -> None:
        self.setText(" ".join(tex_to_unicode(segment.text).split()))


class CodeBlock(QFrame):
    kind = "code"

    def __init__(self):
        super().__init__()
        self.code, self.language = None, None
        self.copy_text = None  # what Copy puts on the clipboard: the code, unless show_segment was told otherwise
        self.setObjectName("codeBlock")
        self.language_label = QLabel()
        self.language_label.setProperty("tone", "muted")
        self.copy_button = IconButton("copy", "Copy code", "Copy this code block")
        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.copy_text))
        self.body = QLabel()
        self.body.setTextFormat(Qt.TextFormat.RichText)
        self.body.setWordWrap(True)
        self.body.setTextInteractionFlags(SELECTABLE)
        header = QHBoxLayout()
        header.setContentsMargins(0, 0, 0, 0)
        header.addWidget(self.language_label)
        header.addStretch()
        header.addWidget(self.copy_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 6, 8, 10)
        layout.setSpacing(2)
        layout.addLayout(header)
        layout.addWidget(self.body)

    def show_segment(self, segment: Segment, copy: str | None = None) -> None:
        """Show a code segment; Copy gives `copy` when it is given, else the code."""
        self.copy_text = segment.text if copy is None else copy
        if (segment.text, segment.language) == (self.code, self.language):
            return
        dark = is_dark(self)
        self.code, self.language = segment.text, segment.language
        self.language_label.setText(segment.language or "code")
        self.setStyleSheet(f"#codeBlock {{ background: {code_background(dark)}; }}")
        self.body.setText(highlight_html(segment.text, segment.language, dark))


class MarkdownView(QWidget):
    def __init__(self, text: str = ""):
        super().__init__()
        self.markdown = ""
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(6)
        self._parts: list[ProseLabel | CodeBlock | QuoteBlock | MathBlock] = []
        self.set_markdown(text)

    def set_markdown(self, text: str) -> None:
        if text == self.markdown and self._parts:
            return
        self.markdown = text
        segments = split_markdown(text) or [Segment("prose", "")]
        for i, segment in enumerate(segments):
            if i < len(self._parts) and self._parts[i].kind != segment.kind:
                self._remove_from(i)
            if i == len(self._parts):
                part = PARTS[segment.kind]()
                self._parts.append(part)
                self._layout.addWidget(part)
            self._parts[i].show_segment(segment)
        self._remove_from(len(segments))

    def _remove_from(self, index: int) -> None:
        for part in self._parts[index:]:
            self._layout.removeWidget(part)
            part.deleteLater()
        del self._parts[index:]


PARTS = {part.kind: part for part in (ProseLabel, CodeBlock, QuoteBlock, MathBlock)}
