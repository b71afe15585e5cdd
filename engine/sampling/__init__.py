"""Sampling (spec 13.6): the llama.cpp-compatible sampler chain and the logit-processor seam."""

from engine.sampling.processor import LogitProcessor, StructuredProcessor, has_structure
from engine.sampling.sampler import Sampler, SamplerConfig

__all__ = ["LogitProcessor", "Sampler", "SamplerConfig", "StructuredProcessor", "has_structure"]
