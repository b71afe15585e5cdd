"""A conversation's settings: its cache, and how each of its replies is sampled, bounded and stopped."""

from __future__ import annotations

from dataclasses import dataclass

from engine.kv.cache import KvDtype
from engine.sampling import LogitProcessor, SamplerConfig
from engine.sampling.grammar import Grammar


@dataclass(frozen=True)
class ChatOptions:
    system: str | None = None
    capacity: int = 4096                 # KV positions; the whole conversation must fit
    kv_dtype: KvDtype | str = KvDtype.F16
    max_tokens: int = 1024               # per reply
    think_off: bool = False              # render with the reasoning channel closed (ChatML, Gemma 4)
    sampler: SamplerConfig = SamplerConfig()
    extra_stop_ids: tuple[int, ...] = ()
    stop_sequences: tuple[str, ...] = ()  # a reply stops before the token that completes one
    processor: LogitProcessor | None = None  # re-armed (reset) at every turn start
    speculation: bool = False  # decode replies speculatively (engine.chat.speculation): same output, fewer forwards
    grammar: Grammar | None = None  # every reply follows it and ends on the stop marker (instead of processor)

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if any(not s for s in self.stop_sequences):
            raise ValueError("stop sequences must not be empty")
        if self.grammar is not None and self.processor is not None:
            raise ValueError("a chat takes a grammar or a logit processor, not both")
