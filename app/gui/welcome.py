"""What an empty chat shows: the app's mark, a line of welcome and a few example prompts; clicking one
sends it (or, with no model loaded yet, puts it in the message box)."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QGridLayout, QLabel, QPushButton, QSizePolicy, QVBoxLayout, QWidget

from app.gui.theme import SPACE_L, SPACE_XL
from resources import resource_path

APP_ICON = "icons/org.fucina.Fucina.svg"
EXAMPLE_PROMPTS = [
    ("Explain a concept", "Explain how a hash map works, with an example."),
    ("Write some code", "Write a Python function that reverses a list."),
    ("Plan something", "Plan a relaxed three-day trip to Lisbon."),
    ("Brainstorm", "Suggest five names for a small coffee shop."),
]


class WelcomeScreen(QWidget):
    prompt_chosen = Signal(str)

    def __init__(self):
        super().__init__()
        self.setObjectName("welcome")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)
        self.setAccessibleName("Welcome")
        mark = QLabel()
        mark.setPixmap(QIcon(str(resource_path(APP_ICON))).pixmap(QSize(64, 64)))
        mark.setAlignment(Qt.AlignmentFlag.AlignCenter)
        title = QLabel("What can I help with?")
        title.setObjectName("welcomeTitle")
        title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        subtitle = QLabel("Everything runs on this computer. Pick an example or write your own message.")
        subtitle.setProperty("tone", "muted")
        subtitle.setAlignment(Qt.AlignmentFlag.AlignCenter)
        for label in (title, subtitle):
            label.setWordWrap(True)  # a narrow window wraps them instead of being held wide
        grid = QGridLayout()
        grid.setSpacing(SPACE_L - 4)
        self.prompt_buttons: list[QPushButton] = []
        for i, (heading, prompt) in enumerate(EXAMPLE_PROMPTS):
            button = QPushButton()
            button.setAccessibleName(f"Example: {heading}")
            lines = QVBoxLayout(button)  # a bold heading over the prompt, which a button's own text cannot be
            lines.setContentsMargins(14, 10, 14, 10)
            lines.setSpacing(2)
            for text, style in ((heading, "exampleHeading"), (prompt, "")):
                label = QLabel(text)
                label.setObjectName(style)
                label.setProperty("tone", "muted" if not style else None)
                label.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)  # the click is the button's
                # clipped in a narrow window rather than holding it wide (the tooltip has the whole prompt)
                label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
                lines.addWidget(label)
            button.setMinimumHeight(lines.sizeHint().height())
            button.setToolTip(prompt)
            button.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
            button.setMaximumWidth(380)
            button.clicked.connect(lambda _=False, text=prompt: self.prompt_chosen.emit(text))
            grid.addWidget(button, i // 2, i % 2)
            self.prompt_buttons.append(button)
        column = QVBoxLayout(self)
        column.setContentsMargins(SPACE_XL, SPACE_XL, SPACE_XL, SPACE_XL)
        column.addStretch(2)
        column.addWidget(mark)
        column.addSpacing(SPACE_L)
        column.addWidget(title)
        column.addWidget(subtitle)
        column.addSpacing(SPACE_XL)
        column.addLayout(grid)
        column.addStretch(3)
