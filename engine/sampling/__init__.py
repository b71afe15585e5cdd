"""Sampling (spec 13.6): the llama.cpp-compatible sampler chain and the logit-processor seam."""

from engine.sampling.processor import LogitProcessor, StructuredProcessor, has_structure
from engine.sampling.sampler import CHAT_DEFAULTS, Sampler, SamplerConfig

__all__ = ["CHAT_DEFAULTS", "LogitProcessor", "Sampler", "SamplerConfig", "StructuredProcessor", "has_structure"]
