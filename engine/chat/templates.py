"""Built-in chat formats (spec 13.8.1): ChatML, Llama 3, Gemma (1-3) and Gemma 4.

`Template.detect` sniffs the format from a GGUF's `tokenizer.chat_template`. A template renders one user
turn for an incrementally driven conversation (`render_turn`) or a full message history for a fresh one
(`render_messages`, the stateless-server shape); the first turn renders byte-identically either way, so
both prefill the same KV prefix. The text never carries BOS: the tokenizer's BOS policy adds it, as
llama.cpp does, so renders match llama.cpp's `llama_chat_apply_template` byte for byte.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Literal, Sequence

from engine.chat.reasoning import ReasoningFormat, reasoning_format
from engine.errors import ChatTemplateError, EmptyMessages, SystemMidConversation, TrailingAssistantMessage
from engine.tools import ToolCall, ToolResult

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class Message:
    role: Role
    content: str
    reasoning: str = ""  # an assistant reply's reasoning, apart from its answer (engine.chat.reasoning)
    tool_calls: tuple[ToolCall, ...] = ()  # the tools an assistant reply called (engine.chat.tool_format)
    tool_call_id: str = ""  # a tool message: the call it answers
    name: str = ""          # a tool message: the tool that answered

    @classmethod
    def tool_result(cls, call: ToolCall, result: ToolResult) -> "Message":
        """The tool message that gives `call` its result."""
        return cls("tool", result.content, tool_call_id=call.id, name=call.name)


class Format(str, Enum):
    CHATML = "chatml"
    LLAMA3 = "llama3"
    GEMMA = "gemma"
    GEMMA4 = "gemma4"


@dataclass(frozen=True)
class _Style:
    head: str            # opens a role block; {role} is the role name
    tail: str            # closes a block; starts with the stop marker
    stop: str            # the token text that ends an assistant turn
    assistant: str       # the assistant's role name
    system: str          # "block": its own block anywhere; "slot": one block at the start; "fold": into turn 1
    trim: bool           # contents are stripped of surrounding whitespace (llama.cpp and the model cards)
    think_off: str = ""  # primed empty reasoning after the assistant opener
    reasoning: re.Pattern | None = None  # a historical reply's reasoning block, dropped from renders

    def block(self, role: str, content: str) -> str:
        name = self.assistant if role == "assistant" else role
        return self.head.format(role=name) + (content.strip() if self.trim else content) + self.tail

    def opener(self, think_off: bool) -> str:
        return self.head.format(role=self.assistant) + (self.think_off if think_off else "")


# Qwen3's rule: keep what follows the last </think>, less leading newlines.
_THINK = re.compile(r"\A.*</think>\n*", re.DOTALL)
_CHANNEL = re.compile(r"<\|channel>.*?<channel\|>", re.DOTALL)

_STYLES = {
    Format.CHATML: _Style("<|im_start|>{role}\n", "<|im_end|>\n", "<|im_end|>", "assistant", "block", False,
                          "<think>\n\n</think>\n\n", _THINK),
    Format.LLAMA3: _Style("<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>", "<|eot_id|>",
                          "assistant", "block", True),
    Format.GEMMA: _Style("<start_of_turn>{role}\n", "<end_of_turn>\n", "<end_of_turn>", "model", "fold", True),
    Format.GEMMA4: _Style("<|turn>{role}\n", "<turn|>\n", "<turn|>", "model", "slot", True,
                          "<|channel>thought\n<channel|>", _CHANNEL),
}

# The model's side of a reference turn, in formats whose system prompt cannot stand on its own.
REFERENCE_ACK = "I have read the document and will use it to answer."

# Checked in this order: the first marker found in a GGUF template names its format.
_MARKERS = [("<|im_start|>", Format.CHATML), ("<|start_header_id|>", Format.LLAMA3),
            ("<|turn>", Format.GEMMA4), ("<start_of_turn>", Format.GEMMA)]


@dataclass(frozen=True)
class Template:
    format: Format
    # What the model's own template puts in when a chat has no system prompt (SmolLM2, Qwen2.5 do).
    default_system: str | None = None
    # How its replies write their reasoning (Qwen3's ChatML template: <think>); built-in formats drop a
    # past reply's reasoning from renders, as Qwen3's template does before the last user message.
    reasoning: ReasoningFormat | None = None
    # Gives the model's own template (a JinjaTemplate, made at the first call) where its text names `tools`:
    # chats with tools render through it, as the model was trained to see them (engine.chat.tool_render).
    tools_template: Callable[[], Any] | None = field(default=None, compare=False, repr=False)

    @staticmethod
    def detect(chat_template: str | None) -> Template | None:
        """The built-in format a GGUF `tokenizer.chat_template` uses, or None when it is none of them."""
        for marker, fmt in _MARKERS:
            if chat_template and marker in chat_template:
                return Template(fmt, reasoning=reasoning_format(chat_template))
        return None

    @property
    def stop_marker(self) -> str:
        return _STYLES[self.format].stop

    def render_turn(self, user: str, *, system: str | None = None, first: bool = True,
                    think_off: bool = False) -> str:
        """The text to feed for one user turn. The first turn carries the conversation-start scaffolding
        (the system prompt); a later one first closes the previous assistant turn, whose stop marker
        ended generation and was never fed."""
        style = _STYLES[self.format]
        if first:
            return self._render(style, self._with_system(system, [Message("user", user)]), think_off)
        return style.tail + style.block("user", user) + style.opener(think_off)

    def render_messages(self, messages: Sequence[Message], *, think_off: bool = False,
                        reasoning_effort: str | None = None) -> str:
        """A full history for a fresh conversation, ending with the assistant-turn opener. No built-in
        format reads a reasoning effort."""
        check_history(messages)
        if messages[0].role != "system":
            messages = self._with_system(None, list(messages))
        return self._render(_STYLES[self.format], list(messages), think_off)

    def render_reference(self, content: str) -> str:
        """Reference material (an attached document) as closed blocks that a chat can follow: a system block
        where the format has a system role anywhere, else a user turn the model acknowledges."""
        style = _STYLES[self.format]
        if style.system == "block":
            return style.block("system", content)
        return style.block("user", content) + style.block("assistant", REFERENCE_ACK)

    def _with_system(self, system: str | None, messages: list[Message]) -> list[Message]:
        system = self.default_system if system is None else system
        return messages if system is None else [Message("system", system), *messages]

    def _render(self, style: _Style, messages: list[Message], think_off: bool) -> str:
        system, rest = _leading_system(style, messages)
        out = [style.block("system", system)] if system is not None and style.system == "slot" else []
        for m in rest:
            if m.role not in ("system", "user", "assistant"):
                raise ChatTemplateError(f"unknown message role {m.role!r} (use system, user or assistant)")
            content = m.content
            if m.role == "assistant" and style.reasoning is not None:
                content = style.reasoning.sub("", content)
            if system is not None and style.system == "fold" and m.role == "user":
                content = system.strip() + "\n\n" + content.strip()
                system = None
            out.append(style.block(m.role, content))
        if system is not None and style.system == "fold":
            raise ChatTemplateError(f"{self.format.value} has no system role: the system prompt needs a user "
                                    "message to be folded into")
        return "".join(out) + style.opener(think_off)


def check_history(messages: Sequence[Message]) -> None:
    """What every format refuses to render as a prompt."""
    if not messages:
        raise EmptyMessages("cannot render an empty message list")
    if messages[-1].role == "assistant":
        raise TrailingAssistantMessage(
            "the history ends with an assistant message; rendering would open a second assistant turn")


def _leading_system(style: _Style, messages: list[Message]) -> tuple[str | None, list[Message]]:
    """Formats with one system slot merge the leading system messages into it; a later one is an error.
    Formats that give every system message its own block keep them in place."""
    if style.system == "block":
        return None, messages
    n = 0
    while n < len(messages) and messages[n].role == "system":
        n += 1
    if any(m.role == "system" for m in messages[n:]):
        raise SystemMidConversation("this model's chat format has one system prompt, at the start of the "
                                    "conversation; a system message cannot follow other messages")
    if n == 0:
        return None, messages
    system = "\n\n".join(m.content.strip() if style.trim else m.content for m in messages[:n])
    if style.system == "fold" and not system.strip():
        system = None  # an empty system prompt folds to nothing, as in llama.cpp
    return system, messages[n:]
