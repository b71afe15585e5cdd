"""The tools a chat offers: the configured MCP servers' and the built-in offline ones (the user's
conversations, the chat's attached documents, the file the user picked), behind the user's switches, kept
for the life of the app so a server started once serves every turn, and asking the user before each call
that is not always allowed."""

from __future__ import annotations

import os
from typing import Callable

from engine.tools import ToolCall, ToolResult
from engine.tools.approval import AskingToolbox, Decision
from engine.tools.builtin import BuiltinToolbox, ConversationSearch, DocumentReader, PickedFile
from engine.tools.mcp_client import DEFAULT_TIMEOUT_S, McpToolbox
from engine.tools.mcp_config import ServerConfig
from engine.tools.toolbox import CombinedToolbox, ToolSwitches


class ChatToolbox:
    """`documents` gives the open chat's attached documents as (name, path) pairs."""

    def __init__(self, history_db: str | os.PathLike, documents: Callable[[], list[tuple[str, str]]], *,
                 timeout: float = DEFAULT_TIMEOUT_S):
        self.timeout = timeout
        self.picked = PickedFile()
        self._servers: dict[str, ServerConfig] = {}
        self._mcp = McpToolbox({}, timeout)
        builtins = BuiltinToolbox([ConversationSearch(history_db), DocumentReader(documents), self.picked])
        self.toolbox = CombinedToolbox([self._mcp, builtins])

    def configure(self, servers: dict[str, ServerConfig], switches: ToolSwitches) -> None:
        """The user's servers and switches, from the next call on; servers that changed are stopped and
        started again when next used."""
        if servers != self._servers:
            self._mcp.close()
            old, self._mcp, self._servers = self._mcp, McpToolbox(servers, self.timeout), servers
            self.toolbox.replace_part(old, self._mcp)
        self.toolbox.switches = switches

    def asking(self, ask: Callable[[ToolCall], Decision], *, on_always: Callable[[str], None] | None = None,
               on_result: Callable[[ToolCall, ToolResult], None] | None = None) -> AskingToolbox:
        """The switched-on tools for one turn, each call asked about first unless always allowed."""
        return AskingToolbox(self.toolbox, ask, on_always=on_always, on_result=on_result)

    def close(self) -> None:
        self.toolbox.close()
