"""A reply's reasoning, above its answer: a fold whose header says "Thinking…" while the model reasons and
"Thought for 3.2 s" once it answered, and whose body is the reasoning in the muted text colour. Open while
the reasoning streams, so it can be read as it comes; folded once the answer starts, and for a stored
reply, so the answer is what the card shows first."""

from __future__ import annotations

from PySide6.QtCore import QElapsedTimer, Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.gui.icons import IconButton
from app.gui.markdown_view import SELECTABLE


def thought_for(seconds: float) -> str:
    return f"Thought for {seconds:.1f} s" if seconds < 60 else f"Thought for {seconds / 60:.0f} min"


class ThinkingBlock(QWidget):
    def __init__(self, reasoning: str, seconds: float | None = None, *, live: bool = False):
        """`seconds`: how long the stored reply thought (None: not known); `live`: the reasoning is streaming."""
        super().__init__()
        self.setObjectName("thinkingBlock")
        self.live = live
        self._clock = QElapsedTimer()
        if live:
            self._clock.start()
        self.toggle = IconButton("chevron-down", "Thinking", "Show or hide the model's reasoning",
                                 text="Thinking…" if live else _summary(seconds))
        self.toggle.clicked.connect(lambda: self.set_expanded(not self.expanded))
        self.body = QLabel(reasoning)
        self.body.setObjectName("thinkingText")
        self.body.setTextFormat(Qt.TextFormat.PlainText)
        self.body.setWordWrap(True)
        self.body.setTextInteractionFlags(SELECTABLE)
        self.body.setProperty("tone", "muted")
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 6)  # apart from the answer below
        column.setSpacing(2)
        column.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        column.addWidget(self.body)
        self.set_expanded(live)

    @property
    def text(self) -> str:
        return self.body.text()

    def set_text(self, reasoning: str) -> None:
        """Streaming: the reasoning so far."""
        self.body.setText(reasoning)

    def finish(self) -> None:
        """The answer started: the header says how long the model thought, and the reasoning folds."""
        if not self.live:
            return
        self.live = False
        self.toggle.setText(thought_for(self._clock.elapsed() / 1e3))
        self.set_expanded(False)

    def set_expanded(self, expanded: bool) -> None:
        self.expanded = expanded
        self.body.setVisible(expanded)
        self.toggle.set_icon_name("chevron-up" if expanded else "chevron-down")
        self.toggle.setAccessibleName("Hide the reasoning" if expanded else "Show the reasoning")


def _summary(seconds: float | None) -> str:
    """A stored reply's header: how long it thought, or (not known: a chat imported or older) that it did."""
    return "Thought" if seconds is None else thought_for(seconds)
