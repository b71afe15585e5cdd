"""The tools a chat offers: the configured MCP servers' and the built-in offline ones (the user's
conversations, the chat's attached documents, the file the user picked), behind the user's switches, kept
for the life of the app so a server started once serves every turn, and asking the user before each call
that is not always allowed."""

from __future__ import annotations

import os
from typing import Callable

from engine.history.store import HistoryStore
from engine.tools import ToolCall, ToolResult
from engine.tools.approval import AskingToolbox, Decision
from engine.tools.builtin import BuiltinToolbox, ConversationSearch, DocumentReader, PickedFile
from engine.tools.mcp_client import DEFAULT_TIMEOUT_S, McpToolbox
from engine.tools.mcp_config import ServerConfig
from engine.tools.toolbox import CombinedToolbox, ToolSwitches


class ChatToolbox:
    """`open_conversation()` gives the id of the chat whose turns call the tools (None: a new chat)."""

    def __init__(self, history_db: str | os.PathLike, open_conversation: Callable[[], str | None], *,
                 timeout: float = DEFAULT_TIMEOUT_S):
        self.history_db, self.open_conversation, self.timeout = history_db, open_conversation, timeout
        self.picked = PickedFile()
        self._servers: dict[str, ServerConfig] = {}
        self._mcp = McpToolbox({}, timeout)
        builtins = BuiltinToolbox([ConversationSearch(history_db, open_conversation),
                                   DocumentReader(self._attached_documents), self.picked])
        self.toolbox = CombinedToolbox([self._mcp, builtins])

    def _attached_documents(self) -> list[tuple[str, str]]:
        """The open chat's documents, on a store connection of the calling thread's own."""
        conversation = self.open_conversation()
        if conversation is None:
            return []
        with HistoryStore(self.history_db) as store:
            return [(row["name"], row["path"]) for row in store.attachments(conversation)]

    def configure(self, servers: dict[str, ServerConfig], switches: ToolSwitches) -> None:
        """The user's servers and switches, from the next call on; servers that changed are stopped and
        started again when next used."""
        if servers != self._servers:
            self._mcp.close()
            old, self._mcp, self._servers = self._mcp, McpToolbox(servers, self.timeout), servers
            self.toolbox.replace_part(old, self._mcp)
        self.toolbox.switches = switches

    def asking(self, ask: Callable[[ToolCall], Decision], *, on_always: Callable[[str], None] | None = None,
               on_result: Callable[[ToolCall, ToolResult], None] | None = None,
               enabled: frozenset[str] | None = None) -> AskingToolbox:
        """The switched-on tools for one turn (only those in `enabled`, the chat's own, where it is given), each
        call asked about first unless always allowed."""
        return AskingToolbox(self.toolbox, ask, on_always=on_always, on_result=on_result, enabled=enabled)

    def close(self) -> None:
        self.toolbox.close()
