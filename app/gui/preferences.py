"""What the app remembers between runs: window geometry, the theme and whether the sidebar shows, the last
conversation and model, recently used model files, named settings presets, whether replies decode
speculatively, the documents' disk budget, the memory for streamed experts, where the model runs, the remote
endpoint (its URL, API key and model, and whether the app uses it rather than a local model), the local server's
port and API key, and the MCP servers, the tools switched on and how replies are offered them. One INI file next
to the history database, so a data directory (`FUCINA_HOME`) carries everything; the API keys are kept there in
plain text like every other setting (the file is the user's, in their data directory)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings

from app.gui.theme import THEMES
from engine.cartridge.build import DEFAULT_DISK_BUDGET
from engine.tools.toolbox import ToolSwitches

RECENT_MODELS = 8
DEFAULT_SERVER_PORT = 8080  # `fucina serve`'s


class Preferences:
    def __init__(self, path: Path):
        self._settings = QSettings(str(path), QSettings.Format.IniFormat)

    def sync(self) -> None:
        self._settings.sync()

    @property
    def geometry(self) -> QByteArray | None:
        return self._settings.value("window/geometry")

    @geometry.setter
    def geometry(self, value: QByteArray) -> None:
        self._settings.setValue("window/geometry", value)

    @property
    def theme(self) -> str:
        """One of theme.THEMES; "system" (follow the system) unless chosen, or when the file says nonsense."""
        value = self._settings.value("window/theme", "system")
        return value if value in THEMES else "system"

    @theme.setter
    def theme(self, value: str) -> None:
        self._settings.setValue("window/theme", value)

    @property
    def sidebar_visible(self) -> bool:
        return self._settings.value("window/sidebar", True, type=bool)

    @sidebar_visible.setter
    def sidebar_visible(self, visible: bool) -> None:
        self._settings.setValue("window/sidebar", visible)

    @property
    def last_conversation(self) -> str | None:
        return self._settings.value("session/conversation") or None

    @last_conversation.setter
    def last_conversation(self, conversation_id: str | None) -> None:
        self._settings.setValue("session/conversation", conversation_id or "")

    @property
    def speculation(self) -> bool:
        """Decode replies speculatively: on unless turned off (the cost gate keeps it from costing time)."""
        return self._settings.value("engine/speculation", True, type=bool)

    @speculation.setter
    def speculation(self, on: bool) -> None:
        self._settings.setValue("engine/speculation", on)

    @property
    def disk_budget(self) -> int:
        """Bytes the documents' cartridges may take on disk (the least recently used go beyond it)."""
        return self._settings.value("documents/disk_budget", DEFAULT_DISK_BUDGET, type=int)

    @disk_budget.setter
    def disk_budget(self, budget: int) -> None:
        self._settings.setValue("documents/disk_budget", int(budget))

    @property
    def expert_cache(self) -> int | None:
        """Bytes of a model's experts kept in memory when the model is too large for memory with them mapped
        and the rest stream from disk; None (the default): most of the memory free when it loads."""
        budget = self._settings.value("models/expert_cache", 0, type=int)
        return budget if budget > 0 else None

    @expert_cache.setter
    def expert_cache(self, budget: int | None) -> None:
        self._settings.setValue("models/expert_cache", int(budget or 0))

    @property
    def backend(self) -> str:
        """Where models run: "auto" (a CUDA GPU when present, Metal on macOS, else the CPU), "cpu", "cuda", "gpu"."""
        return self._settings.value("engine/backend", "auto")

    @backend.setter
    def backend(self, name: str) -> None:
        self._settings.setValue("engine/backend", name)

    @property
    def recent_models(self) -> list[str]:
        """Model files, most recently used first; the first is the one to load at start."""
        return json.loads(self._settings.value("models/recent", "[]"))

    def add_recent_model(self, path: str) -> None:
        recent = [path] + [p for p in self.recent_models if p != path]
        self._settings.setValue("models/recent", json.dumps(recent[:RECENT_MODELS]))

    @property
    def presets(self) -> dict[str, dict]:
        """Named conversation settings: {"system_prompt": str | None, "sampler": {...}}."""
        return json.loads(self._settings.value("presets/all", "{}"))

    def save_preset(self, name: str, settings: dict) -> None:
        self._settings.setValue("presets/all", json.dumps({**self.presets, name: settings}))

    def delete_preset(self, name: str) -> None:
        self._settings.setValue("presets/all", json.dumps({k: v for k, v in self.presets.items() if k != name}))

    @property
    def remote_endpoint(self) -> dict:
        """The remote endpoint last used: {"url", "api_key", "model"} (empty strings when unset)."""
        return {key: self._settings.value(f"remote/{key}", "") for key in ("url", "api_key", "model")}

    @remote_endpoint.setter
    def remote_endpoint(self, endpoint: dict) -> None:
        for key in ("url", "api_key", "model"):
            self._settings.setValue(f"remote/{key}", endpoint.get(key) or "")

    @property
    def remote_in_use(self) -> bool:
        """Chat through the remote endpoint (at start too) rather than a local model."""
        return self._settings.value("remote/in_use", False, type=bool)

    @remote_in_use.setter
    def remote_in_use(self, on: bool) -> None:
        self._settings.setValue("remote/in_use", on)

    @property
    def server_port(self) -> int:
        """The local server's port (0: any free one)."""
        return self._settings.value("server/port", DEFAULT_SERVER_PORT, type=int)

    @server_port.setter
    def server_port(self, port: int) -> None:
        self._settings.setValue("server/port", port)

    @property
    def server_api_key(self) -> str:
        """The local server's API key: made on first use and kept, so its clients keep working."""
        key = self._settings.value("server/api_key", "")
        if not key:
            key = secrets.token_urlsafe(24)
            self._settings.setValue("server/api_key", key)
        return key

    @property
    def mcp_servers(self) -> str:
        """The MCP servers' `mcpServers` JSON as the user wrote or imported it ("": none)."""
        return self._settings.value("tools/mcp_servers", "")

    @mcp_servers.setter
    def mcp_servers(self, text: str) -> None:
        self._settings.setValue("tools/mcp_servers", text)

    @property
    def tool_switches(self) -> ToolSwitches:
        """The tools switched on, and those that run without asking (every tool off until chosen)."""
        return ToolSwitches.from_json(self._settings.value("tools/switches", ""))

    @tool_switches.setter
    def tool_switches(self, switches: ToolSwitches) -> None:
        self._settings.setValue("tools/switches", switches.to_json())

    @property
    def tool_choice(self) -> str:
        """How replies are offered the tools switched on (app.gui.tool_choice): "auto" unless chosen,
        "required", "none" or a tool's name."""
        return self._settings.value("tools/choice", "auto")

    @tool_choice.setter
    def tool_choice(self, choice: str) -> None:
        self._settings.setValue("tools/choice", choice)
