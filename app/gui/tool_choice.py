"""The tool choice beside the message input: how the next replies are offered the tools switched on in the
settings (app.gui.tools_dialog). Auto: the model decides whether to call one; Required: a turn's first
reply is a call; None: the tools are not offered; or one tool by name, called first (engine.chat.tool_use).
Below the choices, "In this chat" lists the tools switched on, each checked while this chat offers it.

A chat follows the app's default choice and every tool switched on until it is given its own setting: a
choice made in the menu, or a tool unchecked there, is the open chat's alone (stored with it), so another
chat keeps the defaults. The button shows the choice in force and opens the menu; it is hidden while no tool
is on, as there is nothing to choose then."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QAction, QActionGroup
from PySide6.QtWidgets import QMenu, QToolButton

from app.gui.icons import IconButton

AUTO = "auto"
WAYS = {AUTO: ("Auto", "The model decides whether to call a tool"),
        "required": ("Required", "The model must call a tool first"),
        "none": ("None", "The tools are not offered")}


def _describe(choice: str) -> tuple[str, str]:
    """The button's text for `choice`, and what it means."""
    return WAYS.get(choice) or (choice, f"The model calls {choice} first")


class ToolChoiceButton(IconButton):
    chosen = Signal(str)  # the app's default choice gave way to Auto (the tool it named was switched off)
    # The open chat's own setting changed in the menu: {"enabled": [tool names on in it], "choice": ...}
    chat_tools_changed = Signal(object)

    def __init__(self, choice: str = AUTO):
        """`choice`: the app's remembered default; show_tools() gives the tools it may name, show_chat() the
        open chat's own setting."""
        super().__init__("tool", "Tool choice", "", text=_describe(choice)[0])
        self.setObjectName("toolChoice")
        self.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(self)
        menu.setToolTipsVisible(True)
        self.setMenu(menu)
        self._group = QActionGroup(self)  # one choice checked
        self.options: dict[str, QAction] = {}
        self.in_chat: dict[str, QAction] = {}  # each tool switched on, checked while this chat offers it
        self.default = choice
        self.own: dict | None = None  # the open chat's own setting (None: it follows the defaults)
        self.hide()

    @property
    def choice(self) -> str:
        """The choice in force in the open chat."""
        return self.own["choice"] if self.own else self.default

    def show_tools(self, names: list[str]) -> None:
        """The tools switched on, each offered by name and listed for this chat (none: the button hides). A
        tool chosen by name that is off now gives way to Auto."""
        self.menu().clear()
        self.options, self.in_chat = {}, {}
        for choice in WAYS:
            self._add(choice)
        if names:
            self.menu().addSeparator()  # the ways above, the tools below
        for name in names:
            self._add(name)
        if names:
            self.menu().addSection("In this chat")
        for name in names:
            self._add_in_chat(name)
        self.setVisible(bool(names))
        if self.choice not in self.options:
            self._give_way()
        self._show_choice()

    def _add(self, choice: str) -> None:
        text, meaning = _describe(choice)
        action = self.menu().addAction(text)
        action.setCheckable(True)
        action.setToolTip(meaning)
        action.triggered.connect(lambda _=False: self.choose(choice))
        self._group.addAction(action)
        self.options[choice] = action

    def _add_in_chat(self, name: str) -> None:
        action = self.menu().addAction(name)
        action.setCheckable(True)
        action.setToolTip(f"Offer {name} in this chat")
        action.toggled.connect(lambda on: self._keep(name, on))
        self.in_chat[name] = action

    def _give_way(self) -> None:
        """The choice in force names a tool switched off: Auto in its place, told where it is kept."""
        if self.own is None:
            self.default = AUTO
            self.chosen.emit(AUTO)
        else:
            self._own_changed(self._kept(), AUTO)

    def choose(self, choice: str) -> None:
        """What a menu item does: `choice` (one of self.options) is the open chat's, in force and shown."""
        self._own_changed(self._kept(), choice)

    def _keep(self, name: str, on: bool) -> None:
        """A tool checked or unchecked in the menu: the open chat offers it or not from now on."""
        kept = self._kept()
        if (name in kept) != on:
            self._own_changed(kept | {name} if on else kept - {name}, self.choice)

    def _kept(self) -> set[str]:
        """The tools switched on that the open chat offers."""
        return {name for name in self.in_chat if self.own is None or name in self.own["enabled"]}

    def _own_changed(self, kept: set[str], choice: str) -> None:
        self.own = {"enabled": sorted(kept), "choice": choice}
        self._show_choice()
        self.chat_tools_changed.emit(self.own)

    def show_chat(self, own: dict | None) -> None:
        """The open chat's own setting (None: the defaults), shown without telling anyone."""
        self.own = own
        self._show_choice()

    def set_default(self, choice: str) -> None:
        """The app's default choice, shown while the open chat has no setting of its own."""
        self.default = choice
        self._show_choice()

    def _show_choice(self) -> None:
        kept = self._kept()
        for name, action in self.in_chat.items():
            action.blockSignals(True)  # shown, not chosen
            action.setChecked(name in kept)
            action.blockSignals(False)
        if self.choice in self.options:
            self.options[self.choice].setChecked(True)
        text, meaning = _describe(self.choice)
        self.setText(text)
        fewer = len(kept) < len(self.in_chat)
        self.setToolTip(f"Tool choice — {meaning}" + (f"; {len(kept)} of {len(self.in_chat)} tools on in this chat"
                                                       if fewer else ""))
