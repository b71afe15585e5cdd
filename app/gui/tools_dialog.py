"""The tools a reply may call: the MCP servers (their `mcpServers` JSON, written here or imported from an
LM Studio mcp.json or a Claude Desktop config, checked as you type) and a table of every tool known, each
switched on or off and allowed always or asked about (engine.tools.toolbox.ToolSwitches).

The built-in tools are always in the table; a server's tools come in when "List the servers' tools" starts
the servers, on a thread of its own (a server may take seconds to start, or never answer: the window does
not wait for it). Tools switched on before stay listed, so a server that is down now keeps its choices.
Saved to the preferences on OK.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QFileDialog, QHBoxLayout, QHeaderView, QLabel,
                               QPlainTextEdit, QPushButton, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from app.gui.preferences import Preferences
from engine.tools.builtin import READ_DOCUMENT, READ_FILE, SEARCH_CONVERSATIONS
from engine.tools.mcp_client import McpToolbox
from engine.tools.mcp_config import McpConfigError, load_servers, parse_servers
from engine.tools.toolbox import ToolSwitches

BUILTIN_LABELS = {SEARCH_CONVERSATIONS: "Search my conversations",
                  READ_DOCUMENT: "Read the chat's attached documents",
                  READ_FILE: "Read a file I pick for the chat"}
PLACEHOLDER = '{"mcpServers": {\n  "files": {"command": "npx", "args": ["-y", "a-server"]},\n' \
              '  "web": {"url": "http://127.0.0.1:8000/mcp"}\n}}'
LIST_TIMEOUT_S = 30.0
NAME, ON, ALWAYS = range(3)


class ToolsDialog(QDialog):
    _listed = Signal(object, object)  # from the listing thread: the servers' ToolSpecs, {server: why it failed}

    def __init__(self, preferences: Preferences, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Tools")
        self.preferences = preferences
        self.servers = QPlainTextEdit(preferences.mcp_servers)
        self.servers.setPlaceholderText(PLACEHOLDER)
        self.servers.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.servers.setAccessibleName("MCP servers (JSON)")
        self.servers_status = QLabel()
        self.servers_status.setWordWrap(True)
        self.servers_status.setProperty("tone", "muted")
        import_button = QPushButton("Import from file…")
        import_button.clicked.connect(lambda: self.import_file())
        self.list_button = QPushButton("List the servers' tools")
        self.list_button.clicked.connect(self.list_tools)
        server_row = QHBoxLayout()
        server_row.addWidget(import_button)
        server_row.addWidget(self.list_button)
        server_row.addStretch(1)

        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["Tool", "On", "Always allow"])
        self.table.horizontalHeader().setSectionResizeMode(NAME, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().hide()
        self.table.setAccessibleName("Tools")
        switches = preferences.tool_switches
        for name in [*BUILTIN_LABELS, *sorted((switches.enabled | switches.always_allowed) - set(BUILTIN_LABELS))]:
            self._add_row(name, BUILTIN_LABELS.get(name, name), "", switches)

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.ok = buttons.button(QDialogButtonBox.StandardButton.Ok)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.accepted.connect(self.save)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("MCP servers, as LM Studio's mcp.json and Claude Desktop's config write them"))
        layout.addWidget(self.servers, 1)
        layout.addWidget(self.servers_status)
        layout.addLayout(server_row)
        layout.addWidget(self.table, 1)
        layout.addWidget(buttons)
        self.servers.textChanged.connect(self._check)
        self._listed.connect(self._show_listed)
        self._check()

    def servers_error(self) -> str | None:
        try:
            parse_servers(self.servers.toPlainText())
        except McpConfigError as e:
            return str(e)
        return None

    def _check(self) -> None:
        """The servers' JSON as typed: its error, or how many servers it names; OK only when it is valid."""
        error = self.servers_error()
        if error is None:
            count = len(parse_servers(self.servers.toPlainText()))
            self.servers_status.setText(f"{count} server{'s' * (count != 1)}" if count else "No MCP servers")
        else:
            self.servers_status.setText(error)
        self.ok.setEnabled(error is None)
        self.list_button.setEnabled(error is None)

    def import_file(self, path: str | None = None) -> None:
        """Add the servers of an mcp.json (or a Claude Desktop config) to those written here; a server of the
        same name is replaced by the file's."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Import MCP servers", str(Path.home()), "JSON (*.json)")
            if not path:
                return
        try:
            load_servers(path)  # checked first: a bad file changes nothing here
        except McpConfigError as e:
            self.servers_status.setText(e.args[0])
            return
        imported = json.loads(Path(path).read_text(encoding="utf-8"))["mcpServers"]
        current = json.loads(self.servers.toPlainText().strip() or "{}") if self.servers_error() is None else {}
        merged = {**current.get("mcpServers", {}), **imported}
        self.servers.setPlainText(json.dumps({"mcpServers": merged}, indent=2, ensure_ascii=False))

    def list_tools(self) -> None:
        servers = parse_servers(self.servers.toPlainText())
        self.list_button.setEnabled(False)
        self.servers_status.setText("Starting the servers…")
        threading.Thread(target=self._list_in_background, args=(servers,), name="fucina-list-tools",
                         daemon=True).start()

    def _list_in_background(self, servers) -> None:
        toolbox = McpToolbox(servers, timeout=LIST_TIMEOUT_S)
        try:
            specs, failures = toolbox.specs(), dict(toolbox.failures)
        finally:
            toolbox.close()
        try:
            self._listed.emit(specs, failures)
        except RuntimeError:  # the dialog was closed meanwhile
            pass

    def _show_listed(self, specs, failures: dict[str, str]) -> None:
        switches, known = self.switches(), set(self.names())
        for spec in specs:
            if spec.name not in known:
                self._add_row(spec.name, spec.name, spec.description, switches)
        listed = f"{len(specs)} tool{'s' * (len(specs) != 1)} listed"
        self.servers_status.setText("\n".join([listed, *failures.values()]))
        self.list_button.setEnabled(self.servers_error() is None)

    def _add_row(self, name: str, label: str, description: str, switches: ToolSwitches) -> None:
        row = self.table.rowCount()
        self.table.insertRow(row)
        item = QTableWidgetItem(label)
        item.setData(Qt.ItemDataRole.UserRole, name)
        item.setToolTip(description or name)
        item.setFlags(Qt.ItemFlag.ItemIsEnabled)
        self.table.setItem(row, NAME, item)
        for column, on in ((ON, name in switches.enabled), (ALWAYS, name in switches.always_allowed)):
            box = QTableWidgetItem()
            box.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsUserCheckable)
            box.setCheckState(Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)
            self.table.setItem(row, column, box)

    def names(self) -> list[str]:
        return [self.table.item(row, NAME).data(Qt.ItemDataRole.UserRole) for row in range(self.table.rowCount())]

    def set_checked(self, name: str, column: int, on: bool) -> None:
        row = self.names().index(name)
        self.table.item(row, column).setCheckState(Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)

    def switches(self) -> ToolSwitches:
        def checked(column: int) -> frozenset[str]:
            return frozenset(name for row, name in enumerate(self.names())
                             if self.table.item(row, column).checkState() == Qt.CheckState.Checked)

        return ToolSwitches(checked(ON), checked(ALWAYS))

    def save(self) -> None:
        self.preferences.mcp_servers = self.servers.toPlainText()
        self.preferences.tool_switches = self.switches()
