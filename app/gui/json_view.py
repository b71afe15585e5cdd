"""A reply that follows a JSON response format: pretty-printed and highlighted, with a Copy button that
copies the reply exactly as the model wrote it. While it streams (or when it was cut short) it does not
parse yet, and is shown as written."""

from __future__ import annotations

import json

from PySide6.QtWidgets import QVBoxLayout, QWidget

from app.gui.markdown_segments import Segment
from app.gui.markdown_view import CodeBlock

JSON_FORMATS = ("json_object", "json_schema")  # the response formats whose replies are JSON


def pretty_json(text: str) -> str | None:
    """`text` parsed and laid out with two-space indents; None when it is not (yet) one JSON value."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return json.dumps(value, indent=2, ensure_ascii=False)


class JsonView(QWidget):
    def __init__(self, text: str = ""):
        super().__init__()
        self.block = CodeBlock()
        self.block.copy_button.setToolTip("Copy the reply as written")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.block)
        self.text = None
        self.set_text(text)

    def set_text(self, text: str) -> None:
        if text == self.text:
            return
        self.text = text
        pretty = pretty_json(text)
        self.block.show_segment(Segment("code", text if pretty is None else pretty, "json"), copy=text)
        self.block.language_label.setText("JSON" if pretty is not None else "JSON, as written")
