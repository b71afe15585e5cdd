"""A conversation's response format: free text, any JSON object, a JSON schema, a regex or a grammar
(Lark, GBNF), edited with a text box that validates as you type and shows llguidance's error inline.

Validation compiles the grammar text alone (no tokenizer: the model's vocabulary is the engine thread's
business), debounced, on a thread of its own: a large schema compiles in a few hundred milliseconds, and
llguidance releases the GIL while it does, so typing never waits for it. The setting is the store's
{"type": KIND, "grammar": TEXT} (engine.sampling.grammar.Grammar.as_setting); free text is None.
"""

from __future__ import annotations

import itertools
import json
from concurrent.futures import ThreadPoolExecutor

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

from engine.errors import InvalidGrammar
from engine.sampling.grammar import Grammar

FREE = "free"
FORMATS = {FREE: "Free text", "json_object": "JSON (any object)", "json_schema": "JSON schema",
           "regex": "Regex", "lark": "Lark grammar", "gbnf": "GBNF grammar"}
WITHOUT_TEXT = (FREE, "json_object")
PLACEHOLDERS = {"json_schema": '{"type": "object", "properties": {…}}', "regex": "(yes|no)",
                "lark": 'start: "yes" | "no"', "gbnf": 'root ::= "yes" | "no"'}
DEBOUNCE_MS = 300


def _schema(schema: dict) -> str:
    return json.dumps(schema, indent=2)


SCHEMA_PRESETS = {
    "Object with named fields": _schema({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                       "city": {"type": "string"}},
        "required": ["name", "age", "city"], "additionalProperties": False}),
    "List of strings": _schema({"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 10}),
    "Yes/no answer": _schema({
        "type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
        "required": ["answer"], "additionalProperties": False}),
}


def grammar_error(kind: str, text: str) -> str | None:
    """What llguidance says is wrong with `text` as a `kind` grammar; None when it is valid."""
    if not text.strip():
        return f"Empty: write the {FORMATS[kind]} here, or choose Free text"
    try:
        Grammar(kind, text)
    except InvalidGrammar as e:
        return str(e)
    return None


class GrammarValidator(QObject):
    """Validates grammar texts one at a time off the GUI thread; `validated(request, error)` comes back
    queued, on the GUI thread. One for the app (`shared()`), so it outlives every editor that asks it."""

    validated = Signal(int, object)  # request number, error text or None

    _shared: "GrammarValidator | None" = None

    def __init__(self):
        super().__init__()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fucina-grammar")
        self._requests = itertools.count(1)

    @classmethod
    def shared(cls) -> "GrammarValidator":
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared

    def submit(self, kind: str, text: str) -> int:
        request = next(self._requests)
        self._pool.submit(lambda: self.validated.emit(request, grammar_error(kind, text)))
        return request


class ResponseFormatEditor(QWidget):
    """The format chooser, the grammar text box with its presets, and the validation message under it.
    `valid` is True once the text shown has been checked and found valid (always, for a format without
    text); `validity_changed` tells every change of it."""

    validity_changed = Signal(bool)

    def __init__(self, validator: GrammarValidator | None = None):
        super().__init__()
        self._validator = validator or GrammarValidator.shared()
        self._validator.validated.connect(self._validated)
        self._request = 0  # the validation whose answer counts; older answers are stale
        self.valid = True
        self.kind = QComboBox()
        self.kind.setAccessibleName("Response format")
        for kind, label in FORMATS.items():
            self.kind.addItem(label, kind)
        self.presets = QComboBox()
        self.presets.setAccessibleName("Example schemas")
        self.presets.setPlaceholderText("Start from an example schema…")
        self.presets.addItems(list(SCHEMA_PRESETS))
        self.presets.setCurrentIndex(-1)
        self.text = QPlainTextEdit()
        self.text.setAccessibleName("Grammar")
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.text.setMinimumHeight(140)
        self.message = QLabel()
        self.message.setAccessibleName("Grammar check")
        self.message.setWordWrap(True)
        self._debounce = QTimer(self, singleShot=True, interval=DEBOUNCE_MS)
        self._debounce.timeout.connect(self._validate)

        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.kind, 1)
        top.addWidget(self.presets, 1)
        self.editor = QWidget()
        editor = QVBoxLayout(self.editor)
        editor.setContentsMargins(0, 0, 0, 0)
        editor.addWidget(self.text)
        editor.addWidget(self.message)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.editor)

        self.kind.currentIndexChanged.connect(self._kind_changed)
        self.presets.activated.connect(self._use_preset)
        self.text.textChanged.connect(self._text_changed)
        self._kind_changed()

    # -- the setting ---------------------------------------------------------------------------------
    def set_format(self, setting: dict | None) -> None:
        """Show a stored response format (None: free text)."""
        setting = setting or {"type": FREE}
        self.kind.setCurrentIndex(max(0, self.kind.findData(setting.get("type", FREE))))
        self.text.setPlainText(setting.get("grammar", ""))
        self._validate()  # at once: the stored text is not being typed

    def format(self) -> dict | None:
        """The setting to store; None for free text."""
        kind = self.kind.currentData()
        if kind == FREE:
            return None
        return {"type": kind, "grammar": "" if kind == "json_object" else self.text.toPlainText()}

    # -- editing -------------------------------------------------------------------------------------
    def _kind_changed(self) -> None:
        kind = self.kind.currentData()
        self.editor.setVisible(kind not in WITHOUT_TEXT)
        self.text.setPlaceholderText(PLACEHOLDERS.get(kind, ""))
        self._validate()

    def _use_preset(self) -> None:
        """A preset is a JSON schema: it switches the format to one."""
        self.kind.setCurrentIndex(self.kind.findData("json_schema"))
        self.text.setPlainText(SCHEMA_PRESETS[self.presets.currentText()])
        self.presets.setCurrentIndex(-1)

    def _text_changed(self) -> None:
        self._request = 0  # an answer still on its way is about the text before this change
        self._set_valid(False)  # until the new text is checked
        self.message.setText("checking…")
        self._debounce.start()

    def _validate(self) -> None:
        self._debounce.stop()
        kind = self.kind.currentData()
        if kind in WITHOUT_TEXT:
            self._request = 0
            self._show(None)
            return
        self._set_valid(False)
        self._request = self._validator.submit(kind, self.text.toPlainText())

    def _validated(self, request: int, error: str | None) -> None:
        if request == self._request:
            self._show(error)

    def _show(self, error: str | None) -> None:
        kind = self.kind.currentData()
        if error is not None:  # monospaced: llguidance points at the error with a caret under the line
            self.message.setText(error)
            self.message.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
            self.message.setStyleSheet("color: #d64545")
        elif kind in WITHOUT_TEXT:
            self.message.clear()
        else:
            self.message.setText(f"✓ {FORMATS[kind]} is valid")
            self.message.setFont(self.font())
            self.message.setStyleSheet("color: #2f9e44")
        self._set_valid(error is None)

    def _set_valid(self, valid: bool) -> None:
        if valid != self.valid:
            self.valid = valid
            self.validity_changed.emit(valid)
