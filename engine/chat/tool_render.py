"""A chat with tools, rendered for a model: through its own template's `tools` variable where it has one.

- A GGUF template that reads `tools` (Qwen2.5's, Llama 3.1's, gpt-oss's) renders the tools, the replies'
  calls (OpenAI's `tool_calls`) and the `tool` messages itself, as the model was trained to see them. A
  built-in format keeps such a template for this (Template.tools_template).
- A template without tool support (SmolLM2's) gets them as text its format can carry: the tools described
  in the system prompt in Hermes's format, past calls written into the replies as Hermes calls, and tool
  results as user messages in `<tool_response>` blocks (as Qwen2.5's template writes them).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Sequence

from engine.chat.jinja_template import JinjaTemplate
from engine.chat.templates import Message, Template
from engine.chat.tool_format import ToolFormat, detect_tool_format
from engine.tools import ToolCall, ToolSpec

_INSTRUCTIONS = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                 "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{tools}\n"
                 "</tools>\n\nFor each function call, return a json object with function name and arguments "
                 "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                 '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


def tool_template(template: Template | JinjaTemplate) -> JinjaTemplate | None:
    """The template that renders a chat's tools itself, if the model has one."""
    if isinstance(template, JinjaTemplate):
        own = template
    else:
        own = template.tools_template() if template.tools_template is not None else None
    return own if own is not None and own.renders_tools else None


def tool_format_of(template: Template | JinjaTemplate) -> ToolFormat:
    """How the model writes calls: its tool template's format, else Hermes (what the fallback describes)."""
    own = tool_template(template)
    return detect_tool_format(own.source) if own is not None else detect_tool_format(None)


def render_with_tools(template: Template | JinjaTemplate, messages: Sequence[Message], tools: Sequence[ToolSpec],
                      *, think_off: bool = False, reasoning_effort: str | None = None) -> str:
    """A full history ending with the assistant's opener, with `tools` offered. With none, past calls and
    results are still rendered as the tool template writes them; a chat with neither renders as without
    tools (the built-in format, which adds no default system prompt)."""
    own = tool_template(template)
    if not tools and not any(m.role == "tool" or m.tool_calls for m in messages):
        own = None  # nothing of tools to render: the chat's own format, as without them
    if own is not None:
        return own.render_messages(messages, think_off=think_off, reasoning_effort=reasoning_effort,
                                   tools=[t.as_openai() for t in tools])
    plain = as_plain_messages(messages, tools)
    return template.render_messages(plain, think_off=think_off, reasoning_effort=reasoning_effort)


def as_plain_messages(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> list[Message]:
    """The chat as system/user/assistant messages that any template renders (the fallback)."""
    out = list(messages)
    if tools:
        described = _INSTRUCTIONS.format(tools="".join("\n" + json.dumps(t.as_openai(), ensure_ascii=False)
                                                       for t in tools))
        if out and out[0].role == "system":
            out[0] = replace(out[0], content=out[0].content + "\n\n" + described)
        else:
            out.insert(0, Message("system", described))
    plain: list[Message] = []
    for m in out:
        if m.role == "assistant" and m.tool_calls:
            calls = "".join(_hermes_call(c) for c in m.tool_calls)
            plain.append(Message("assistant", (m.content + "\n" if m.content else "") + calls.lstrip("\n"),
                                 m.reasoning))
        elif m.role == "tool":
            block = f"<tool_response>\n{m.content}\n</tool_response>"
            if plain and plain[-1].role == "user" and plain[-1].content.startswith("<tool_response>"):
                plain[-1] = replace(plain[-1], content=plain[-1].content + "\n" + block)  # one turn per round
            else:
                plain.append(Message("user", block))
        else:
            plain.append(m)
    return plain


def _hermes_call(call: ToolCall) -> str:
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"\n<tool_call>\n{body}\n</tool_call>"
