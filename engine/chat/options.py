"""A conversation's settings: its cache, and how each of its replies is sampled, bounded and stopped."""

from __future__ import annotations

from dataclasses import dataclass

from engine.chat.tool_use import ToolUse
from engine.kv.cache import KvDtype
from engine.sampling import LogitProcessor, SamplerConfig
from engine.sampling.grammar import Grammar

EFFORTS = ("low", "medium", "high")  # gpt-oss's reasoning efforts (its template's reasoning_effort)
THINK_CHOICES = ("on", "off", *EFFORTS)


@dataclass(frozen=True)
class ChatOptions:
    system: str | None = None
    capacity: int = 4096                 # KV positions; the whole conversation must fit
    kv_dtype: KvDtype | str = KvDtype.F16
    max_tokens: int = 1024               # per reply
    think_off: bool = False              # render with the reasoning channel closed (ChatML, Gemma 4)
    reasoning_effort: str | None = None  # one of EFFORTS, for templates that read it (gpt-oss)
    thinking_budget: int | None = None   # reasoning tokens before its closing marker is forced
    split_reasoning: bool = True  # tell a reply's reasoning from its answer (off: the raw text, a completion's)
    sampler: SamplerConfig = SamplerConfig()
    extra_stop_ids: tuple[int, ...] = ()
    stop_sequences: tuple[str, ...] = ()  # a reply stops before the token that completes one
    processor: LogitProcessor | None = None  # re-armed (reset) at every turn start
    speculation: bool = False  # decode replies speculatively (engine.chat.speculation): same output, fewer forwards
    model_drafts: bool = True  # with speculation: drafts from the model's next-token layer too, where it has one
    grammar: Grammar | None = None  # every reply follows it and ends on the stop marker (instead of processor)
    tools: ToolUse | None = None  # tools the replies may call: rendered, and each call held to its schema

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if any(not s for s in self.stop_sequences):
            raise ValueError("stop sequences must not be empty")
        if self.reasoning_effort not in (None, *EFFORTS):
            raise ValueError(f"reasoning effort must be one of {', '.join(EFFORTS)}, got {self.reasoning_effort!r}")
        if self.thinking_budget is not None and self.thinking_budget < 0:
            raise ValueError(f"a thinking budget must be 0 or more tokens, got {self.thinking_budget}")
        if self.grammar is not None and self.processor is not None:
            raise ValueError("a chat takes a grammar or a logit processor, not both")
        if self.tools is not None and self.tools.active and (self.grammar is not None or self.processor is not None):
            raise ValueError("a chat with tools takes no grammar or logit processor: its calls have their own")


def think_options(think: str | None) -> dict:
    """ChatOptions fields for a chat's `think` setting (THINK_CHOICES; None: the template's default): off
    closes the reasoning in the prompt where the template can (enable_thinking), an effort thinks that hard."""
    if think is None or think == "on":
        return {}
    if think == "off":
        return {"think_off": True}
    if think in EFFORTS:
        return {"reasoning_effort": think}
    raise ValueError(f"think must be one of {', '.join(THINK_CHOICES)}, got {think!r}")
