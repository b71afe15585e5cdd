"""A decoder layer composed of its parts: pre-norm, mixer, (post-norm), residual; pre-norm, feed-forward,
(post-norm), residual."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.gguf.reader import GGUFFile
from engine.gguf.weights import load_vector
from engine.models.layout import TensorSpec, layer_prefix, norm
from engine.models.parts import FeedForwardArgs, MixerArgs
from kernels.backend import OP_ADD, OP_RMSNORM, Backend, LayerSpec, Segment


@dataclass(frozen=True)
class LayerArgs:
    mixer: MixerArgs
    feed_forward: FeedForwardArgs
    post_norms: bool = False  # Gemma's norms after the mixer and after the feed-forward
    ffn_norm: str = "ffn_norm.weight"  # the feed-forward's pre-norm (gpt-oss: "post_attention_norm.weight")

    def ops(self) -> set[str]:
        """The backend ops the layer runs on: its parts' and the norms' and residuals'."""
        return {OP_RMSNORM, OP_ADD, *self.mixer.OPS, *self.feed_forward.OPS}

    def tensors(self, p: str, n_embd: int) -> list[TensorSpec]:
        tensors = [norm(p + "attn_norm.weight", n_embd), *self.mixer.tensors(p, n_embd)]
        if self.post_norms:
            tensors += [norm(p + "post_attention_norm.weight", n_embd), norm(p + "post_ffw_norm.weight", n_embd)]
        return tensors + [norm(p + self.ffn_norm, n_embd), *self.feed_forward.tensors(p, n_embd)]

    def build(self, file: GGUFFile, layer: int, n_embd: int, eps: float, backend: Backend,
              cache_layer: int | None = None) -> "Block":
        """The layer's block (a family with more to its layers builds its own Block)."""
        return Block(file, self, layer, n_embd, eps, backend, cache_layer)


class Block:
    def __init__(self, file: GGUFFile, args: LayerArgs, layer: int, n_embd: int, eps: float, backend: Backend,
                 cache_layer: int | None = None):
        """Layer `layer` of the file (its blk.N. tensors), its rows in a KV cache at `cache_layer` (default the
        same index; a next-token-prediction layer keeps a cache of its own)."""
        p = layer_prefix(layer)
        self.index = layer
        self.backend = backend
        self.eps = eps

        def vector(name):
            return backend.upload_vector(load_vector(file, p + name, n_embd))

        self.attn_norm = vector("attn_norm.weight")
        self.mixer = args.mixer.build(file, p, layer if cache_layer is None else cache_layer, n_embd, eps, backend)
        self.ffn_norm = vector(args.ffn_norm)
        self.feed_forward = args.feed_forward.build(file, p, layer, n_embd, backend)
        self.post_attn_norm = self.post_ffn_norm = None
        if args.post_norms:
            self.post_attn_norm = vector("post_attention_norm.weight")
            self.post_ffn_norm = vector("post_ffw_norm.weight")

    def moe_parts(self) -> list:
        """The layer's Mixture-of-Experts feed-forwards (engine.models.experts.MoeFfn), which may stream."""
        return [self.feed_forward] if hasattr(self.feed_forward, "stream_from") else []

    def spec(self) -> LayerSpec | None:
        """This layer as a backend's fused row-wise stack reads it; None when a part has no fused form."""
        mixer, feed_forward = self.mixer.spec(), self.feed_forward.spec()
        if mixer is None or feed_forward is None:
            return None
        return LayerSpec(mixer=mixer, feed_forward=feed_forward, attn_norm=self.attn_norm, ffn_norm=self.ffn_norm,
                         post_attn_norm=self.post_attn_norm, post_ffn_norm=self.post_ffn_norm, eps=float(self.eps))

    def __call__(self, x, segments: Sequence[Segment], positions: np.ndarray, row_wise: bool, layer_input=None):
        """x [rows, n_embd] of every segment through this layer, its ops row-wise or prefill (layer_input: the
        model's input of this layer, ModelArgs.layer_inputs; unused here)."""
        be = self.backend
        a = self.mixer(be.rmsnorm(x, self.attn_norm, self.eps), segments, positions, row_wise)
        if self.post_attn_norm is not None:
            a = be.rmsnorm(a, self.post_attn_norm, self.eps)
        x = be.add(x, a)
        f = self.feed_forward(be.rmsnorm(x, self.ffn_norm, self.eps), row_wise)
        if self.post_ffn_norm is not None:
            f = be.rmsnorm(f, self.post_ffn_norm, self.eps)
        return be.add(x, f)
