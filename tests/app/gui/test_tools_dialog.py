"""The tools settings: the MCP servers' JSON (written, checked as typed, imported from a file), each tool
switched on and allowed always or not, remembered; a server's tools listed without the window waiting."""

import json
import sys

from app.gui.preferences import Preferences
from app.gui.settings_dialog import SettingsDialog
from app.gui.tools_dialog import ALWAYS, ON, ToolsDialog
from engine.tools.builtin import READ_FILE, SEARCH_CONVERSATIONS
from engine.tools.toolbox import ToolSwitches
from tests.engine.tools.conftest import SERVER_SCRIPT


def dialog_on(qtbot, preferences):
    dialog = ToolsDialog(preferences)
    qtbot.addWidget(dialog)
    return dialog


def test_built_in_tools_are_listed_off_and_choices_are_remembered(qtbot, tmp_path):
    preferences = Preferences(tmp_path / "gui.ini")
    dialog = dialog_on(qtbot, preferences)
    assert dialog.names() == ["search_conversations", "read_document", "read_file"]
    assert dialog.switches() == ToolSwitches()  # every tool off until chosen
    dialog.set_checked(SEARCH_CONVERSATIONS, ON, True)
    dialog.set_checked(READ_FILE, ON, True)
    dialog.set_checked(READ_FILE, ALWAYS, True)
    servers = json.dumps({"mcpServers": {"calc": {"command": sys.executable, "args": [str(SERVER_SCRIPT)]}}})
    dialog.servers.setPlainText(servers)
    dialog.accept()
    again = Preferences(tmp_path / "gui.ini")
    assert again.tool_switches == ToolSwitches(frozenset({SEARCH_CONVERSATIONS, READ_FILE}), frozenset({READ_FILE}))
    assert again.mcp_servers == servers


def test_the_servers_json_is_checked_as_typed_and_ok_waits_for_it(qtbot, tmp_path):
    dialog = dialog_on(qtbot, Preferences(tmp_path / "gui.ini"))
    assert dialog.servers_status.text() == "No MCP servers" and dialog.ok.isEnabled()
    dialog.servers.setPlainText('{"mcpServers": {"web": {"url": "ftp://x"}}}')
    assert not dialog.ok.isEnabled()
    assert 'server "web": "url" must start with http:// or https://' in dialog.servers_status.text()
    dialog.servers.setPlainText('{"mcpServers": {"web": {"url": "http://127.0.0.1:1/mcp"}}}')
    assert dialog.ok.isEnabled() and dialog.servers_status.text() == "1 server"


def test_import_adds_a_files_servers_and_a_bad_file_changes_nothing(qtbot, tmp_path):
    dialog = dialog_on(qtbot, Preferences(tmp_path / "gui.ini"))
    dialog.servers.setPlainText('{"mcpServers": {"mine": {"command": "mine-server"}}}')
    claude = tmp_path / "claude_desktop_config.json"
    claude.write_text(json.dumps({"globalShortcut": "",
                                  "mcpServers": {"files": {"command": "npx", "args": ["-y", "f"]}}}))
    dialog.import_file(str(claude))
    assert json.loads(dialog.servers.toPlainText()) == {"mcpServers": {
        "mine": {"command": "mine-server"}, "files": {"command": "npx", "args": ["-y", "f"]}}}
    bad = tmp_path / "mcp.json"
    bad.write_text('{"mcpServers": {"x": {"args": []}}}')
    before = dialog.servers.toPlainText()
    dialog.import_file(str(bad))
    assert dialog.servers.toPlainText() == before
    assert dialog.servers_status.text().startswith(f'{bad}: server "x" needs either "command"')


def test_listing_starts_the_servers_off_the_ui_thread_and_adds_their_tools(qtbot, tmp_path):
    dialog = dialog_on(qtbot, Preferences(tmp_path / "gui.ini"))
    dialog.servers.setPlainText(json.dumps({"mcpServers": {
        "calc": {"command": sys.executable, "args": [str(SERVER_SCRIPT)]},
        "ghost": {"command": "no-such-mcp-server-command"}}}))
    dialog.list_button.click()
    assert dialog.servers_status.text() == "Starting the servers…"  # the click returned before any server answered
    qtbot.waitUntil(lambda: "calc__add" in dialog.names(), timeout=60_000)
    assert 'MCP server "ghost" could not start' in dialog.servers_status.text()
    assert dialog.servers_status.text().startswith("5 tools listed")
    dialog.set_checked("calc__add", ON, True)
    assert "calc__add" in dialog.switches().enabled


def test_the_settings_dialog_opens_the_tools(qtbot, tmp_path):
    settings = SettingsDialog({"system_prompt": None, "sampler": {}}, Preferences(tmp_path / "gui.ini"))
    qtbot.addWidget(settings)
    tools = settings.edit_tools()
    assert isinstance(tools, ToolsDialog) and tools.isVisible()
    tools.reject()
