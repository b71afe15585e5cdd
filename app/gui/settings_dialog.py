"""Per-conversation settings: system prompt, sampler, reply length, context length, what happens when the
chat outgrows the context (the context policy), a reasoning model's thinking (on, off or an effort, and a
budget of reasoning tokens) and the response format, with named presets; and the
settings of every chat, speculative decoding, the documents' disk budget, the backend the model runs on and
the tools replies may call (app.gui.tools_dialog, saved on its own OK).

The dialog edits a settings dict shaped like the store's: {"system_prompt": str | None, "sampler": {...}}
with the store's sampler keys; a seed left on "random" and a free-text response format are simply absent.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout,
                               QGroupBox, QHBoxLayout, QInputDialog, QLabel, QPlainTextEdit, QPushButton, QSpinBox,
                               QVBoxLayout, QWidget)

from app.gui.preferences import Preferences
from app.gui.response_format import ResponseFormatEditor
from app.gui.tools_dialog import ToolsDialog
from engine.chat.window import DEFAULT_POLICY
from engine.runtime import BACKENDS
from engine.sampling import CHAT_DEFAULTS
from engine.serving.session import DEFAULT_CONTEXT, DEFAULT_MAX_TOKENS

DEFAULT_SAMPLER = {"temperature": CHAT_DEFAULTS.temperature, "top_k": CHAT_DEFAULTS.top_k,
                   "top_p": CHAT_DEFAULTS.top_p, "min_p": CHAT_DEFAULTS.min_p,
                   "repeat_penalty": CHAT_DEFAULTS.repeat_penalty, "max_tokens": DEFAULT_MAX_TOKENS,
                   "ctx": DEFAULT_CONTEXT, "context_policy": DEFAULT_POLICY}
RANDOM_SEED = -1  # the seed box's lowest value, shown as "random"
CONTEXT_POLICIES = {"drop_oldest": "Leave the oldest turns out (the system prompt stays)",
                    "stop": "Stop and say so"}
# a chat's `think` setting (engine.chat.options.THINK_CHOICES); None: the model's own default
THINKING = {None: "The model's default", "on": "On", "off": "Off (where the model can)",
            "low": "Low effort", "medium": "Medium effort", "high": "High effort"}
NO_BUDGET = -1  # the thinking budget box's lowest value, shown as "no limit"


def _double(low: float, high: float, step: float, decimals: int = 2) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(low, high)
    box.setSingleStep(step)
    box.setDecimals(decimals)
    return box


def _int(low: int, high: int, step: int = 1) -> QSpinBox:
    box = QSpinBox()
    box.setRange(low, high)
    box.setSingleStep(step)
    return box


class SettingsDialog(QDialog):
    tools_changed = Signal()  # the tools dialog saved new tool settings to the preferences

    def __init__(self, settings: dict, preferences: Preferences, parent: QWidget | None = None, *,
                 server_switch: QWidget | None = None):
        """`server_switch`: the local server's switch (app.gui.server_switch), shown under the chat settings."""
        super().__init__(parent)
        self.setWindowTitle("Conversation settings")
        self.preferences = preferences
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("None")
        self.system_prompt.setMaximumHeight(110)  # leaves the dialog's height to the grammar editor
        self.fields = {
            "temperature": _double(0.0, 5.0, 0.05),
            "top_k": _int(0, 100_000),
            "top_p": _double(0.0, 1.0, 0.01),
            "min_p": _double(0.0, 1.0, 0.01),
            "repeat_penalty": _double(0.01, 5.0, 0.05),
            "seed": _int(RANDOM_SEED, 2**31 - 1),
            "max_tokens": _int(1, 131_072, 64),
            "ctx": _int(256, 131_072, 256),
        }
        self.fields["seed"].setSpecialValueText("random")
        self.context_policy = QComboBox()
        for policy, label in CONTEXT_POLICIES.items():
            self.context_policy.addItem(label, policy)
        self.context_policy.setAccessibleName("When the context is full")
        labels = {"temperature": "Temperature (0 = greedy)", "top_k": "Top-k (0 = off)", "top_p": "Top-p",
                  "min_p": "Min-p (0 = off)", "repeat_penalty": "Repeat penalty (1 = off)", "seed": "Seed",
                  "max_tokens": "Max reply tokens", "ctx": "Context length (tokens)"}
        form = QFormLayout()
        form.addRow("System prompt", self.system_prompt)
        for key, box in self.fields.items():
            box.setAccessibleName(labels[key])
            form.addRow(labels[key], box)
        form.addRow("When the context is full", self.context_policy)
        self.thinking = QComboBox()
        for value, label in THINKING.items():
            self.thinking.addItem(label, value)
        self.thinking.setAccessibleName("Thinking")
        self.thinking.setToolTip("A reasoning model's thinking before it answers (Qwen3, DeepSeek-R1, gpt-oss)")
        self.thinking_budget = _int(NO_BUDGET, 131_072, 64)
        self.thinking_budget.setSpecialValueText("no limit")
        self.thinking_budget.setAccessibleName("Thinking budget (tokens)")
        self.thinking_budget.setToolTip("After this many tokens of reasoning the model is made to answer")
        form.addRow("Thinking", self.thinking)
        form.addRow("Thinking budget (tokens)", self.thinking_budget)
        self.response_format = ResponseFormatEditor()
        form.addRow("Response format", self.response_format)
        self.system_prompt.setAccessibleName("System prompt")
        every_chat = self._every_chat_box(preferences)

        self.presets = QComboBox()
        self.presets.setAccessibleName("Presets")
        self.presets.setPlaceholderText("Presets…")
        self._fill_presets()
        self.presets.activated.connect(lambda: self.apply(self.preferences.presets[self.presets.currentText()]))
        save_preset = QPushButton("Save as preset…")
        save_preset.clicked.connect(self._save_preset)
        delete_preset = QPushButton("Delete preset")
        delete_preset.clicked.connect(self._delete_preset)
        preset_row = QHBoxLayout()
        preset_row.addWidget(self.presets, 1)
        preset_row.addWidget(save_preset)
        preset_row.addWidget(delete_preset)

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
                                   | QDialogButtonBox.StandardButton.RestoreDefaults)
        ok = buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.response_format.validity_changed.connect(ok.setEnabled)  # an invalid grammar is never stored
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults).clicked.connect(
            lambda: self.apply({"system_prompt": None, "sampler": {}}))
        layout = QVBoxLayout(self)
        layout.addLayout(preset_row)
        layout.addLayout(form)
        layout.addWidget(every_chat)
        if server_switch is not None:
            self.server_switch = server_switch
            layout.addWidget(server_switch)
        layout.addWidget(buttons)
        self.apply(settings)
        ok.setEnabled(self.response_format.valid)

    def _every_chat_box(self, preferences: Preferences) -> QGroupBox:
        self.speculation = QCheckBox("Speculative decoding")
        self.speculation.setAccessibleName("Speculative decoding")
        self.speculation.setChecked(preferences.speculation)
        note = QLabel("Drafts the next tokens from text the chat already holds and checks them in one step: "
                      "the same replies, faster where they repeat it. From the next reply on.")
        note.setWordWrap(True)
        note.setEnabled(False)  # the palette's muted text
        self.disk_budget = _int(1, 1 << 20, 256)
        self.disk_budget.setSuffix(" MiB")
        self.disk_budget.setAccessibleName("Documents on disk")
        self.disk_budget.setToolTip("Room for documents read into the library; beyond it the least recently "
                                    "used are deleted (and read again when attached)")
        self.disk_budget.setValue(max(1, preferences.disk_budget >> 20))
        budget_row = QHBoxLayout()
        budget_row.addWidget(QLabel("Documents on disk"))
        budget_row.addWidget(self.disk_budget)
        self.expert_cache = _int(0, 1 << 20, 256)
        self.expert_cache.setSuffix(" MiB")
        self.expert_cache.setSpecialValueText("automatic")  # 0: most of the memory free when the model loads
        self.expert_cache.setAccessibleName("Memory for streamed experts")
        self.expert_cache.setToolTip("A Mixture-of-Experts model too large for this machine's memory keeps this "
                                     "much of its experts in memory and reads the others from disk when a token "
                                     "needs them; automatic: most of the memory free when it loads")
        self.expert_cache.setValue((preferences.expert_cache or 0) >> 20)
        experts_row = QHBoxLayout()
        experts_row.addWidget(QLabel("Memory for streamed experts (from the next model load)"))
        experts_row.addWidget(self.expert_cache)
        self.backend = QComboBox()
        self.backend.setAccessibleName("Backend")
        self.backend.addItems(BACKENDS)
        self.backend.setCurrentText(preferences.backend)
        backend_row = QHBoxLayout()
        backend_row.addWidget(QLabel("Run the model on (from the next start)"))
        backend_row.addWidget(self.backend)
        tools = QPushButton("MCP servers and tools…")
        tools.setToolTip("The tools replies may call: MCP servers and the built-in offline tools")
        tools.clicked.connect(self.edit_tools)
        box = QGroupBox("Every chat")
        column = QVBoxLayout(box)
        column.addWidget(self.speculation)
        column.addWidget(note)
        column.addLayout(budget_row)
        column.addLayout(experts_row)
        column.addLayout(backend_row)
        column.addWidget(tools, 0, Qt.AlignmentFlag.AlignLeft)
        return box

    def edit_tools(self) -> ToolsDialog:
        dialog = ToolsDialog(self.preferences, self)
        dialog.accepted.connect(self.tools_changed)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    def disk_budget_bytes(self) -> int:
        return self.disk_budget.value() << 20

    def expert_cache_bytes(self) -> int | None:
        """None: automatic."""
        return (self.expert_cache.value() << 20) or None

    def apply(self, settings: dict) -> None:
        self.system_prompt.setPlainText(settings.get("system_prompt") or "")
        sampler = {**DEFAULT_SAMPLER, "seed": RANDOM_SEED, **(settings.get("sampler") or {})}
        for key, box in self.fields.items():
            box.setValue(sampler[key])
        self.context_policy.setCurrentIndex(self.context_policy.findData(sampler["context_policy"]))
        self.response_format.set_format(sampler.get("response_format"))
        self.thinking.setCurrentIndex(self.thinking.findData(sampler.get("think")))
        budget = sampler.get("thinking_budget")
        self.thinking_budget.setValue(NO_BUDGET if budget is None else budget)

    def settings(self) -> dict:
        sampler = {key: box.value() for key, box in self.fields.items()}
        sampler["context_policy"] = self.context_policy.currentData()
        if sampler["seed"] == RANDOM_SEED:
            del sampler["seed"]
        if self.response_format.format() is not None:
            sampler["response_format"] = self.response_format.format()
        if self.thinking.currentData() is not None:
            sampler["think"] = self.thinking.currentData()
        if self.thinking_budget.value() != NO_BUDGET:
            sampler["thinking_budget"] = self.thinking_budget.value()
        return {"system_prompt": self.system_prompt.toPlainText().strip() or None, "sampler": sampler}

    def _fill_presets(self) -> None:
        self.presets.clear()
        self.presets.addItems(sorted(self.preferences.presets))
        self.presets.setCurrentIndex(-1)

    def _save_preset(self) -> None:
        name, ok = QInputDialog.getText(self, "Save preset", "Preset name:")
        if ok and name.strip():
            self.preferences.save_preset(name.strip(), self.settings())
            self._fill_presets()

    def _delete_preset(self) -> None:
        if self.presets.currentText():
            self.preferences.delete_preset(self.presets.currentText())
            self._fill_presets()
