"""The seam between the engine and the kernels: what a compute backend implements, and which one runs.

The engine (engine/models/transformer.py, engine/gguf/weights.py, engine/kv/) talks only to this
protocol; `kernels.cpu.backend.CpuBackend` is the Numba code behind it, `kernels.cuda` and `kernels.wgpu`
put the same ops on a device (sharing the host's format codecs, `kernels.common`, with the CPU). A family
file never names a backend.

Arrays. An *activation* (`Act`) is a backend's own float32 matrix [rows, cols]: a NumPy array on the CPU,
device memory elsewhere. The engine only passes activations from one op to the next; host data crosses the
seam as token ids and positions (int64 NumPy arrays) going in and `to_host` coming out (logits, hidden
states). Weights are uploaded once, in their GGUF block format, and stay resident (`Weight` handles).

Row-wise vs prefill. `linear` and `attention` take `row_wise`: True gives every row the bits it would get
alone (decode, speculative verification, batched decode); False may use faster batch-shape-dependent
numerics (prefill). A backend may also offer `row_stack`, a run of layers row-wise in one call (the CPU
does: per-op calls cost more than the arithmetic on small models) for the kinds of layer parts it knows;
the engine composes the ops below with row_wise=True for the layers no stack takes.

KV cache. A backend owns its KV storage (`KvStore`, one per conversation cache); the engine's KvCache
keeps the length and the checks. Rows cross the seam in *storage form*: f16 as uint16 bit patterns
[m, kv_heads, head_dim], q8_0 as GGML block_q8_0 bytes [m, kv_heads, head_dim / 32 * 34] (what sidecars
and cartridges store, byte-identical across backends).

Selection: `select_backend("auto" | "cpu" | "cuda" | "gpu")`. A backend lives in `kernels.<package>.backend`
(the package of each name in _PACKAGES: "gpu" is kernels.wgpu) and exposes `create_backend() -> Backend`
(raising BackendUnavailable when it cannot start) and `device_present() -> bool` (cheap, for "auto").
"""

from __future__ import annotations

import importlib
import sys
import warnings
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np

Act = Any  # a backend's float32 [rows, cols] activation (NumPy on the CPU, device memory elsewhere)

BACKENDS = ("auto", "cpu", "cuda", "gpu")
Q8_0_BLOCK = 32  # values per block_q8_0 (f16 scale + 32 int8): a q8_0 KV row's head_dim must be a multiple
Q8_0_BLOCK_BYTES = 2 + Q8_0_BLOCK

# The ops on activations of Backend below, by the names supports_op takes.
OP_EMBED = "embed"
OP_LINEAR = "linear"
OP_RMSNORM = "rmsnorm"
OP_ROPE = "rope"
OP_GATED = "gated"
OP_ADD = "add"
OP_ATTENTION = "attention"
OP_TAKE_ROWS = "take_rows"
OP_MOE_FFN = "moe_ffn"
OP_ATTENTION_SINKS = "attention_sinks"
OP_ROPE_SCALED = "rope_scaled"
OP_LATENT_ATTENTION = "latent_attention"
OP_DELTA_NET = "delta_net"
OP_GATED_SIGMOID = "gated_sigmoid"
OP_ATTENTION_SHARED = "attention_shared"
OP_SCALE = "scale"
OP_MOE_STREAMED = "moe_ffn_streamed"
# Ops that are a method above called with an argument a backend may not have kernels for: the method's name
OP_VARIANTS = {OP_ATTENTION_SINKS: OP_ATTENTION,  # AttentionShape.sinks
               OP_ROPE_SCALED: OP_ROPE,  # a RopeScaling
               OP_GATED_SIGMOID: OP_GATED,  # gated("sigmoid", ...)
               OP_ATTENTION_SHARED: OP_ATTENTION,  # attention(q, None, None, ...): over rows another layer wrote
               OP_MOE_STREAMED: OP_MOE_FFN}  # a MoeSpec with a source: experts read from disk on demand
OPS = frozenset((OP_EMBED, OP_LINEAR, OP_RMSNORM, OP_ROPE, OP_GATED, OP_ADD, OP_ATTENTION, OP_TAKE_ROWS,
                 OP_MOE_FFN, OP_LATENT_ATTENTION, OP_DELTA_NET, OP_SCALE, *OP_VARIANTS))


class BackendUnavailable(RuntimeError):
    """A backend cannot start here (no device, driver or package); the message says which and why."""


class UnsupportedKvDtype(ValueError):
    """A backend does not keep KV caches of this dtype (kv_store)."""


class BackendFallbackWarning(UserWarning):
    """A requested backend could not start and the CPU runs instead."""


class Weight(Protocol):
    """A resident weight W [out_dim, in_dim] in its GGUF block format, with an optional bias [out_dim]."""

    qtype: int
    out_dim: int
    in_dim: int


class KvStore(Protocol):
    """One cache's K/V rows for every layer, in the backend's memory. Positions are absolute rows."""

    dtype: str  # "f16" or "q8_0"

    def row_layout(self, layer: int) -> tuple[np.dtype, tuple[int, int]]:
        """The storage form of one position of a layer: (dtype, (kv_heads, width))."""

    def write_f32(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """Encode float32 host rows [m, kv_heads, head_dim] into positions [start, start + m)."""

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store storage-form host rows [m, kv_heads, width] at positions [start, start + m)."""

    def read(self, layer: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions [start, end) of a layer as storage-form host arrays (K, V); do not keep them past a write."""

    def copy_from(self, src: "KvStore", start: int, end: int) -> None:
        """Positions [start, end) of every layer of a same-geometry store of this backend, to the same rows."""

    def nbytes(self) -> int:
        """Bytes held for K and V together."""


class StateStore(Protocol):
    """One conversation's recurrent state (Gated DeltaNet layers: a conv window and a delta-rule state per
    layer), overwritten as rows are fed, in the backend's memory. It cannot be cut back to a position: the
    engine keeps copies (`save`) at the positions it may rewind to."""

    def save(self) -> Any:
        """A copy of every layer's state, for load()."""

    def load(self, saved: Any) -> None:
        """Every layer's state back to a save()'s."""

    def zero(self) -> None:
        """The state before any row."""

    def keep_rows(self, on: bool) -> None:
        """While on, the mixer's op keeps the state after each row it feeds (a speculative verify's rollback
        points), readable with row_state until the next feed."""

    def row_state(self, i: int) -> Any:
        """The kept state after row i of the last feed (a save()'s kind)."""

    def read(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """A layer's (conv window, delta-rule state) as float32 host copies (what sidecars store)."""

    def write(self, layer: int, conv: np.ndarray, ssm: np.ndarray) -> None:
        """Set a layer's state from host arrays of read()'s shapes."""

    def nbytes(self) -> int:
        """Bytes of one copy of the state."""


@dataclass(frozen=True)
class Segment:
    """Rows [row_start, row_end) of a forward's activations belong to one cache, at positions pos0.."""

    row_start: int
    row_end: int
    store: KvStore
    pos0: int
    state: StateStore | None = None  # the cache's recurrent state (a hybrid model's), else None


@dataclass(frozen=True)
class AttentionShape:
    n_head: int
    n_kv: int
    head_dim: int
    window: int  # sliding window; 0 = global attention
    scale: float
    # a learned logit per query head added to its softmax's denominator, as a key no value belongs to
    # (gpt-oss; ggml_soft_max_add_sinks); a resident vector (upload_vector), or None
    sinks: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class RopeScaling:
    """RoPE's context extension as ggml_rope_ext runs it: every angle times freq_scale (linear), and with
    YaRN (ext_factor 1) the fast-turning dims kept unscaled, a ramp between, and cos and sin times a
    magnitude. The llama.cpp metadata keys "<arch>.rope.scaling.*" name these."""

    factor: float  # the context's extension: freq_scale = 1 / factor
    yarn: bool
    n_ctx_orig: int = 0  # YaRN: the context the model was trained for
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    # YaRN's magnitude as a ratio get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dims) where a family
    # sets mscale_all_dims (llama.cpp's rope_yarn_log_mul: DeepSeek-V2's, whose mscale is the same, so 1);
    # mscale_all_dims 0: get_mscale(factor, 1)
    mscale: float = 1.0
    mscale_all_dims: float = 0.0
    # each rotated pair's angle divided by its factor (ggml's freq_factors: the file's rope_freqs.weight;
    # Gemma 4's proportional RoPE turns most pairs by ~0 with factors of 1e30); None: all 1
    freq_factors: tuple[float, ...] | None = None

    def angle_factors(self, n_rot: int, base: float) -> np.ndarray:
        """Each rotated pair's angle multiplier (float64 [n_rot / 2]): ggml's freq_scale, mixed by YaRN's ramp
        (rope_yarn: theta_interp * (1 - mix) + theta_extrap * mix) with 1 over its correction dims."""
        freq_scale = float(np.float32(1) / np.float32(self.factor))
        pairs = np.arange(n_rot // 2, dtype=np.float64)
        # a factor divides the pair's angle before YaRN's ramp mixes it (ggml's theta_extrap), and the mix is
        # linear in it: dividing the mixed multiplier is the same
        divisors = 1.0 if self.freq_factors is None else np.asarray(self.freq_factors, np.float64)
        if not self.yarn:
            return np.full(pairs.size, freq_scale) / divisors

        def corr_dim(beta):  # ggml_rope_yarn_corr_dim, in float32 as ggml computes it
            f32 = np.float32
            turns = f32(self.n_ctx_orig) / (f32(beta) * f32(2) * f32(np.pi))
            return f32(n_rot) * np.log(turns) / (f32(2) * np.log(f32(base)))

        low = max(0.0, float(np.floor(corr_dim(self.beta_fast))))
        high = min(n_rot - 1.0, float(np.ceil(corr_dim(self.beta_slow))))
        mix = 1 - np.clip((pairs - low) / max(0.001, high - low), 0, 1)
        return (freq_scale * (1 - mix) + mix) / divisors

    def magnitude(self) -> float:
        """What cos and sin are multiplied by: llama.cpp's yarn_attn_factor (which cancels YaRN's own factor
        but for rope.scaling.attn_factor) times the 1 + 0.1 ln(factor) rope_yarn applies, in float32."""
        if not self.yarn:
            return float(self.attn_factor)
        f32 = np.float32
        factor = f32(1) / (f32(1) / f32(self.factor))

        def get_mscale(m):
            return f32(0.1) * f32(m) * np.log(factor) + f32(1) if factor > 1 else f32(1)

        if self.mscale_all_dims:
            mscale = get_mscale(self.mscale) / get_mscale(self.mscale_all_dims)
        else:
            mscale = get_mscale(1.0)
        mscale = mscale * (f32(1) / (f32(1) + f32(0.1) * np.log(factor))) * f32(self.attn_factor)
        return float(mscale * (f32(1) + f32(0.1) * np.log(factor)))


@dataclass(frozen=True)
class AttentionSpec:
    """An attention mixer as a fused row stack reads it. Biases ride on the q/k/v and output weights; sinks on
    the shape."""

    qkv: tuple[Weight, Weight, Weight]
    out: Weight
    q_norm: Any | None  # per-head q/k norms (None: none)
    k_norm: Any | None
    shape: AttentionShape
    rope_dims: int
    rope_neox: bool
    rope_base: float
    rope_scaling: RopeScaling | None = None


@dataclass(frozen=True)
class LatentAttentionSpec:
    """Multi-head latent attention (DeepSeek-V2/V3's MLA) in its absorbed form, as `latent_attention` reads it.
    Each position caches one row, its compressed latent (normed) then its RoPE'd key part: rank + rope_dims
    values, read as both key and value. Each head's query is its non-RoPE part times k_b[head] (absorbed into
    the latent space) then its RoPE'd part; attention over the cached rows gives a latent per head, which
    v_b[head] takes to the head's value width."""

    n_head: int
    rank: int  # the latent's width (kv_lora_rank)
    nope: int  # each head's query dims without RoPE
    rope_dims: int  # each head's query dims with RoPE, and the key's
    v_dim: int  # each head's value width
    kv_norm: Any  # the latent's RMSNorm weight [rank], resident
    k_b: tuple[Weight, ...]  # per head [rank, nope]
    v_b: tuple[Weight, ...]  # per head [v_dim, rank]
    shape: AttentionShape  # n_head heads over one cached head of rank + rope_dims values
    rope_base: float
    rope_neox: bool
    eps: float
    rope_scaling: RopeScaling | None = None


@dataclass(frozen=True)
class DeltaNetSpec:
    """A Gated DeltaNet mixer's recurrence (kernels/cpu/delta_net.py says what it computes): n_k query/key heads
    and n_v value heads of `head` dims; conv_w [d_conv, channels] (the file's transposed: each tap's weights for
    every channel), dt_bias and a [n_v] resident float32."""

    n_k: int
    n_v: int
    head: int
    eps: float
    conv_w: Any = field(compare=False)
    dt_bias: Any = field(compare=False)
    a: Any = field(compare=False)


@dataclass(frozen=True)
class GatedMlpSpec:
    gate_up: tuple[Weight, Weight]
    down: Weight
    activation: str  # "silu" or "gelu" (tanh), gating the up projection


class Gating(str, Enum):
    """How a Mixture-of-Experts router's logits become the selected experts' weights."""

    SOFTMAX = "softmax"  # softmax over every expert, then the top k of it (qwen3moe, mixtral)
    SOFTMAX_WEIGHT = "softmax_weight"  # the top k logits, then a softmax over those k (gpt-oss)
    SIGMOID = "sigmoid"  # a sigmoid of every logit, then the top k of it (DeepSeek-V3, GLM-4.5)


# the experts' activations: silu(gate) * up; gpt-oss's clamped one; gelu(gate) * up (Gemma 4's, tanh approximation)
SWIGLU, SWIGLU_OAI, GEGLU = "silu", "swiglu_oai", "gelu"
EXPERT_ACTIVATIONS = (SWIGLU, SWIGLU_OAI, GEGLU)


@dataclass(frozen=True)
class MoeSpec:
    """A Mixture-of-Experts feed-forward as `moe_ffn` reads it: the experts' SwiGLU weights as the stacked
    GGUF tensors, each one weight (gate and up [n_expert * n_ff_exp, n_embd], down [n_expert * n_embd,
    n_ff_exp]: expert e's rows are the e-th run of n_ff_exp, or n_embd, rows), and the routing."""

    gate: Weight
    up: Weight
    down: Weight
    n_expert: int
    n_used: int  # experts each row is routed to (top k)
    gating: Gating
    normalize: bool  # the selected weights are divided by their sum
    scale: float  # then multiplied by this
    activation: str = SWIGLU  # one of EXPERT_ACTIVATIONS
    # float32 [n_expert, width] biases added to each expert's gate, up and down products (None: none)
    gate_bias: Any = field(default=None, compare=False)
    up_bias: Any = field(default=None, compare=False)
    down_bias: Any = field(default=None, compare=False)
    # float32 [n_expert] added to the gated probabilities to choose the experts, not to weight them
    # (DeepSeek-V3's exp_probs_b: a load-balancing correction); None: none
    selection_bias: Any = field(default=None, compare=False)
    # group-limited routing (DeepSeek-V3): the experts in n_groups runs, the k chosen within the groups_used
    # runs whose two best scores sum highest; 0: none
    n_groups: int = 0
    groups_used: int = 0
    # float32 [n_expert]: each expert's down product times its scale, before the weighting (Gemma 4's
    # per_expert_scale, the file's ffn_down_exps.scale); None: none
    down_scale: Any = field(default=None, compare=False)
    # an ExpertSource: the experts read on demand instead of through gate, up and down's mapped bytes (the
    # weights then give their formats and shapes only); None: mapped
    source: Any = field(default=None, compare=False)


class ExpertSource(Protocol):
    """A layer's experts read from disk on demand (an engine's expert store): `acquire_groups` makes experts
    resident in slots of stacked buffers shaped like the file's stacked tensors, of `capacity` experts."""

    capacity: int
    gate: Any  # uint8 [capacity * n_ff, row bytes]: slot s's rows [s * n_ff, (s + 1) * n_ff); up the same
    up: Any
    down: Any  # uint8 [capacity * n_embd, row bytes]

    def acquire_groups(self, experts: np.ndarray, pairs: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """These distinct experts made resident a group at a time (all at once where they fit the slots): yields
        each group's indices into `experts` (int64) and their slots, valid until the next group is asked for;
        pairs: the rows this call routes to each (what a cache may keep by)."""


@dataclass(frozen=True)
class MoeFfnSpec:
    """A Mixture-of-Experts feed-forward as a fused row stack reads it: the router (its bias rides on it) and
    the experts."""

    router: Weight
    experts: MoeSpec


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer as a backend's fused row-wise stack reads it (weights and vectors uploaded; None
    leaves a step out): its mixer's and feed-forward's specs, a stack takes the kinds it knows."""

    mixer: Any  # AttentionSpec, or another kind's spec
    feed_forward: Any  # GatedMlpSpec, MoeFfnSpec, or another kind's spec
    attn_norm: Any
    ffn_norm: Any
    post_attn_norm: Any | None  # Gemma's norms after attention and FFN
    post_ffn_norm: Any | None
    eps: float


class RowStack(Protocol):
    def forward(self, x: Act, segments: Sequence[Segment]) -> None:
        """x [rows, n_embd] += every layer's attention and FFN outputs, row-wise, in place; writes every row's
        K/V at its position (does not advance the caches)."""

    def rows_ready(self, store: KvStore, wait: bool = False) -> bool:
        """Whether a forward of several rows over caches like `store` runs its own compiled kernels yet (until
        then it runs the one-row kernels, slower, with the same bits); asking starts their compilation in
        the background (wait: and waits for it)."""


class Backend(Protocol):
    name: str  # "cpu", "cuda", "gpu": what the status line and the CLI show

    # -- resident data
    def supports(self, qtype: int) -> bool:
        """Whether upload_weight takes this GGML type (natively or by converting it once at upload)."""

    def native(self, qtype: int) -> bool:
        """Whether this backend multiplies by this GGML type with kernels of its own (else, where it supports
        the type, through a generic path: correct, several times slower)."""

    def supports_op(self, op: str) -> bool:
        """Whether this backend runs the op of this name (one of OPS; a backend may run only some of them).
        A name it does not know: False."""

    def upload_weight(self, qtype: int, raw: np.ndarray, out_dim: int, in_dim: int,
                      bias: np.ndarray | None = None, mapped: bool = False) -> Weight:
        """raw: uint8 [out_dim, row_bytes] GGUF blocks (may be a view of the file's mmap, read-only). mapped: a
        backend that reads host memory reads these bytes where they are (a MoE's stacked experts: a token reads
        few of them, and all of them may not fit memory)."""

    def upload_vector(self, v: np.ndarray) -> Any:
        """A float32 vector (norm weight) kept resident."""

    def state_store(self, shapes: Sequence[tuple[tuple[int, int], tuple[int, int, int]]]) -> StateStore:
        """Zeroed recurrent state for layers of these (conv window, delta-rule state) shapes."""

    def kv_store(self, kv_heads: Sequence[int], head_dims: Sequence[int], capacity: int, dtype: str,
                 value_is_key: Sequence[bool] | None = None) -> KvStore:
        """Storage for `capacity` positions of every layer (zeroed); UnsupportedKvDtype for a dtype this backend
        does not keep. value_is_key: per layer, whether its V rows are its K rows (latent attention caches one
        row, read as both): kept once."""

    # -- ops on activations
    def embed(self, w: Weight, ids: np.ndarray, scale: float) -> Act:
        """Rows W[ids] * scale as an activation [len(ids), in_dim] (ids checked by the caller)."""

    def linear(self, ws: Sequence[Weight], x: Act, row_wise: bool) -> list[Act]:
        """[x @ W.T + bias for W in ws]: weights sharing an input (q/k/v, gate/up) run as one pass."""

    def rmsnorm(self, x: Act, w: Any, eps: float) -> Act:
        """x * rsqrt(mean(x^2) + eps) * w over every run of len(w) values of each row (a row, or a head)."""

    def rope(self, x: Act, positions: np.ndarray, head_dim: int, n_rot: int, base: float, neox: bool,
             scaling: RopeScaling | None = None) -> None:
        """In place: rotate the first n_rot dims of every head of x [rows, heads * head_dim], row i at
        positions[i]; neox pairs dim i with i + n_rot/2, else 2i with 2i+1; `scaling` (the op
        OP_ROPE_SCALED) scales the angles and the magnitude."""

    def gated(self, activation: str, gate: Act, up: Act) -> Act:
        """activation(gate) * up; activation "silu", "gelu" (tanh approximation) or "sigmoid" (OP_GATED_SIGMOID,
        whose gate may also be [rows, 1]: one gate per row)."""

    def add(self, x: Act, y: Act) -> Act:
        """x + y (a residual)."""

    def scale(self, x: Act, factor: float) -> Act:
        """The op OP_SCALE: x times a float32 factor (ggml_scale; Gemma 4's per-layer inputs and layer scales)."""

    def attention(self, q: Act, k: Act, v: Act, segments: Sequence[Segment], layer: int, shape: AttentionShape,
                  row_wise: bool) -> Act:
        """Write each segment's k/v rows [rows, n_kv * head_dim] (post-RoPE) to its store at pos0.., then
        causal (and windowed) attention of its q rows over its store: [rows, n_head * head_dim] (with the
        shape's sinks: the op OP_ATTENTION_SINKS). k and v None (the op OP_ATTENTION_SHARED): nothing written,
        the rows `layer` holds (an earlier layer of the forward wrote them) attended to."""

    def latent_attention(self, spec: LatentAttentionSpec, q: Act, kv: Act, segments: Sequence[Segment],
                         positions: np.ndarray, layer: int, row_wise: bool) -> Act:
        """The op OP_LATENT_ATTENTION: from the query rows q [rows, n_head * (nope + rope_dims)] and the
        compressed rows kv [rows, rank + rope_dims] (the latent before its norm, the key's RoPE part before its
        rotation), write each segment's cache rows at pos0.. and attend: [rows, n_head * v_dim]."""

    def delta_net(self, spec: DeltaNetSpec, mixed: Act, alpha: Act, beta: Act, segments: Sequence[Segment],
                  layer: int) -> Act:
        """The op OP_DELTA_NET: each segment's rows of the mixed projection [rows, 2 n_k head + n_v head] and the
        alpha, beta logits [rows, n_v] through the conv and the gated delta rule on its state's `layer`:
        [rows, n_v * head], every row bitwise what it gives alone."""

    def take_rows(self, x: Act, rows: Sequence[int]) -> Act:
        """x[rows] (each segment's last row before the output head)."""

    def moe_ffn(self, spec: MoeSpec, x: Act, router_logits: Act, row_wise: bool) -> Act:
        """The experts' feed-forward of x [rows, n_embd]: each row's top-`n_used` experts by its gated
        router logits [rows, n_expert] (ties: the lower expert index first, as llama.cpp's stable sort of
        few experts gives), their SwiGLU outputs times their weights, summed in f32 in the order selected
        (the best first). row_wise: each row bitwise what it gives alone; else the rows routed to an expert
        run as one prefill product (its weights read once per call). SOFTMAX_WEIGHT gating ranks the raw
        logits and softmaxes the k selected; the spec's biases are added to each product."""

    def to_host(self, x: Act) -> np.ndarray:
        """The activation as a float32 NumPy array (logits, hidden states)."""

    def row_stack(self, layers: Sequence[LayerSpec], first_layer: int = 0) -> RowStack | None:
        """A fused row-wise forward of these consecutive layers, the first of them layer `first_layer` of the
        model (its KV rows), or None (the engine composes the ops)."""


def kv_rows_f32(dtype: str, stored: np.ndarray) -> np.ndarray:
    """Storage-form KV rows [..., width] as float32 [..., head_dim] (NumPy; off the hot path)."""
    if dtype == "f16":
        return stored.view(np.float16).astype(np.float32)
    blocks = np.ascontiguousarray(stored).reshape(*stored.shape[:-1], -1, Q8_0_BLOCK_BYTES)
    scales = blocks[..., :2].copy().view(np.float16).astype(np.float32)
    values = blocks[..., 2:].view(np.int8).astype(np.float32) * scales
    return values.reshape(*stored.shape[:-1], -1)


# -- selection ----------------------------------------------------------------------------------------


_started: dict[str, Backend] = {}
# The package behind each backend name: users name the wgpu backend "gpu".
_PACKAGES = {"cpu": "cpu", "cuda": "cuda", "gpu": "wgpu"}


def _module(name: str):
    return importlib.import_module(f"kernels.{_PACKAGES[name]}.backend")


def _create(name: str) -> Backend:
    try:
        return _module(name).create_backend()
    except ImportError as e:
        raise BackendUnavailable(f"the {name} backend is not installed ({e})") from None


def _auto_choice() -> str:
    """CUDA when a device is present, Metal (the wgpu backend) on macOS, else the CPU."""
    for name, wanted in (("cuda", True), ("gpu", sys.platform == "darwin")):
        if not wanted:
            continue
        try:
            if _module(name).device_present():
                return name
        except ImportError:
            continue
    return "cpu"


def _warn(message: str) -> None:
    warnings.warn(message, BackendFallbackWarning, stacklevel=3)


def select_backend(name: str = "auto", on_fallback: Callable[[str], None] | None = None) -> Backend:
    """The backend `name` asks for, started once per process. One that cannot start falls back to the
    CPU; `on_fallback` gets the one message saying so (default: a BackendFallbackWarning)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name in _started:
        return _started[name]
    choice = _auto_choice() if name == "auto" else name
    try:
        backend = _started[choice] if choice in _started else _create(choice)
    except BackendUnavailable as e:
        if choice == "cpu":
            raise
        (on_fallback or _warn)(f"the {choice} backend could not start, running on the CPU: {e}")
        backend = select_backend("cpu")
    _started[choice] = _started[name] = backend
    return backend


def set_kernel_threads(n: int) -> None:
    """Threads the CPU kernels use, whichever thread calls them (the CPU backend's; a device's kernels are the
    device's)."""
    from kernels.cpu import quant

    quant.set_num_threads(n)


def kernel_threads() -> int:
    """The CPU kernels' thread count (applied to the calling thread: Numba keeps it per thread)."""
    from kernels.cpu import quant

    return quant.threads()


def cpu_backend() -> Backend:
    """The CPU backend (what a cache or a model made without naming a backend uses)."""
    return select_backend("cpu")
