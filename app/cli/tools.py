"""Tools in `fucina chat`: where a chat's Toolbox comes from, the approval asked before each call runs, and
how calls and results are shown.

`toolbox_from_args` is the seam: `--tools FILE` (an OpenAI `tools` array) gives a toolbox whose tools are
described only: a tool entry may carry a canned `"result"` text, which its calls return, else a call gets
an error result saying nothing runs it. `--mcp FILE` (an `mcpServers` JSON file, as LM Studio's mcp.json or
Claude Desktop's config) adds its servers' tools; given both, the chat gets every tool of both. The chat loop
knows only the protocol (engine.tools.Toolbox).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable, TextIO

from contextlib import ExitStack

from engine.chat.tool_rounds import ToolRan
from engine.chat.tool_use import CHOICES, ToolUse, specs_from_openai
from engine.tools import ToolCall, ToolResult, ToolSpec, Toolbox
from engine.tools.mcp_client import McpToolbox
from engine.tools.mcp_config import McpConfigError, load_servers
from engine.tools.toolbox import CombinedToolbox, ToolSwitches

NOT_RUN = "No program runs this tool here: it is only described (fucina chat --tools)."
_RESULT_SHOWN = 400  # characters of a tool's result shown in the terminal


class DescribedToolbox:
    """The tools of an OpenAI tools file: described, with canned results where the file gives them."""

    def __init__(self, specs: tuple[ToolSpec, ...], results: dict[str, str]):
        self._specs, self._results = specs, results

    @classmethod
    def from_file(cls, path: str | Path) -> "DescribedToolbox":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read the tools file {path}: {e}") from None
        specs = specs_from_openai(data)
        results = {}
        for spec, entry in zip(specs, data):
            result = entry.get("result") if isinstance(entry, dict) else None
            if result is not None:
                results[spec.name] = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
        return cls(specs, results)

    def specs(self) -> list[ToolSpec]:
        return list(self._specs)

    def run(self, call: ToolCall) -> ToolResult:
        start = time.perf_counter()
        result = self._results.get(call.name)
        return ToolResult(call.id, NOT_RUN if result is None else result, is_error=result is None,
                          seconds=time.perf_counter() - start)


def add_tool_options(p) -> None:
    p.add_argument("--tools", metavar="FILE", default=None,
                   help="offer the model the tools of an OpenAI tools JSON file (each may carry a canned "
                        "\"result\"); every call is shown and asked for before it runs")
    p.add_argument("--mcp", metavar="FILE", default=None,
                   help="offer the model the tools of the MCP servers in an mcpServers JSON file (LM Studio's "
                        "mcp.json, Claude Desktop's config); with --tools, the tools of both")
    p.add_argument("--tool-choice", default="auto", metavar="|".join(CHOICES) + "|NAME",
                   help="auto (the model decides), required (a call first), none, or a tool's name")
    p.add_argument("--allow-tools", action="store_true",
                   help="run every tool call without asking (from a pipe, calls are declined without it)")


def toolbox_from_args(args, stack: ExitStack) -> Toolbox | None:
    """The chat's Toolbox, or None when it has no tools; a file or tool choice that cannot be used ends the
    command with a message saying why. MCP servers started for it are stopped when `stack` closes; one that
    will not start is left out, and said so."""
    if not args.tools and not args.mcp:
        return None
    try:
        toolbox = DescribedToolbox.from_file(args.tools) if args.tools else None
        if args.mcp:
            mcp = McpToolbox(load_servers(args.mcp))
            stack.callback(mcp.close)
            toolbox = _every_tool_on([toolbox, mcp] if toolbox is not None else [mcp])
            for server, why in mcp.failures.items():
                print(f"(MCP server {server} left out: {why})", file=sys.stderr)
        ToolUse(tuple(toolbox.specs()), args.tool_choice)  # the choice names one of them
    except (ValueError, McpConfigError) as e:
        raise SystemExit(f"error: {e}") from None
    return toolbox


def _every_tool_on(parts: list[Toolbox]) -> CombinedToolbox:
    """The parts as one toolbox, every tool switched on (the command line named them all); a part that raises
    is an error result, as in the app."""
    combined = CombinedToolbox(parts)
    combined.switches = ToolSwitches(frozenset(spec.name for spec in combined.all_specs()))
    return combined


class TerminalApproval:
    """Asks before a call runs: y (this call), n (decline it), a (always: this tool from now on)."""

    def __init__(self, allow_all: bool, interactive: bool, ask: Callable[[str], str] = input,
                 err: TextIO | None = None):
        self.allow_all, self.interactive, self.ask = allow_all, interactive, ask
        self.err = err or sys.stderr
        self.always: set[str] = set()

    def __call__(self, call: ToolCall) -> bool:
        print(f"\n[tool call] {describe_call(call)}", file=self.err, flush=True)
        if self.allow_all or call.name in self.always:
            return True
        if not self.interactive:
            print("[tool call declined: no terminal to ask; --allow-tools runs calls]", file=self.err)
            return False
        while True:
            try:
                answer = self.ask("run it? [y]es / [n]o / [a]lways for this tool: ").strip().lower()
            except EOFError:
                return False
            if answer in ("y", "yes"):
                return True
            if answer in ("n", "no"):
                return False
            if answer in ("a", "always"):
                self.always.add(call.name)
                return True


def describe_call(call: ToolCall) -> str:
    return f"{call.name}({json.dumps(call.arguments, ensure_ascii=False)})"


def show_tool_ran(event: ToolRan, err: TextIO | None = None) -> None:
    result = event.result
    text = result.content if len(result.content) <= _RESULT_SHOWN else result.content[:_RESULT_SHOWN] + " …"
    label = "tool error" if result.is_error else "tool result"
    print(f"[{label}] {event.call.name}: {text}", file=err or sys.stderr, flush=True)
