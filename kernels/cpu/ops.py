"""Elementwise and row-wise transformer ops: RMSNorm, RoPE, activations, softmax, f16 widening.

All operate on float32 and are Numba-compiled with the on-disk cache on. Over a prefill's rows they split
the rows over the kernel threads (awake anyway: the GEMMs between them are Numba kernels too); each row's
arithmetic is its own, so the split never changes bits. A few rows stay on the calling thread.
"""

import math
from functools import lru_cache

import numpy as np
from numba import njit, prange

from kernels.common.f16 import f16_bits_to_f32
from kernels.cpu.fast_exp import exp32

# numpy's error model: a float division then needs no zero check, which would keep LLVM
# from vectorizing the loops around it; no fast-math, so every compilation sums in the same order
OPS = dict(cache=True, error_model="numpy")
# below this many elements an op runs on the calling thread: waking the other threads costs more
_PARALLEL_ELEMENTS = 1 << 14
idx = np.uint64  # unsigned subscripts: no negative-index fix-up in the way of the loop vectorizer


@njit(**OPS, inline="always")
def rmsnorm_row(x, w, eps, out):
    ss = np.float32(0.0)
    for i in range(x.size):
        ss += x[i] * x[i]
    scale = np.float32(1.0) / np.sqrt(ss / np.float32(x.size) + np.float32(eps))
    for i in range(x.size):
        out[i] = x[i] * scale * w[i]


@njit(**OPS)
def _rmsnorm_serial(x, w, eps, out):
    for r in range(x.shape[0]):
        rmsnorm_row(x[r], w, eps, out[r])


@njit(**OPS, parallel=True)
def _rmsnorm_parallel(x, w, eps, out):
    for r in prange(x.shape[0]):
        rmsnorm_row(x[r], w, eps, out[r])


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray | None = None) -> np.ndarray:
    """x * rsqrt(mean(x^2) + eps) * weight over the last axis of a 2-D (or 3-D, flattened) array."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if out is None:
        out = np.empty_like(x2)
    else:
        out = out.reshape(-1, shape[-1])
    kernel = _rmsnorm_parallel if x2.size >= _PARALLEL_ELEMENTS else _rmsnorm_serial
    kernel(x2, weight, np.float32(eps), out)
    return out.reshape(shape)


@njit(**OPS, inline="always")
def _inverse_frequencies(n_rot, base):
    half = n_rot // 2
    inv = np.empty(half, dtype=np.float64)
    for i in range(half):
        inv[i] = base ** (-2.0 * i / n_rot)
    return inv


@njit(**OPS, inline="always")
def _angles_at(pos, inv, cos, sin):
    """cos and sin (float32 [n_rot/2]) of position pos's angles."""
    for i in range(inv.size):
        theta = pos * inv[i]
        cos[i] = np.float32(math.cos(theta))
        sin[i] = np.float32(math.sin(theta))


@njit(**OPS, inline="always")
def _rotate(x, cos, sin, neox):
    """Rotate the first 2 * cos.size dims of every head of x [heads, head_dim] by the angles' cos and sin."""
    half = cos.size
    for i in range(half):
        a_idx = i if neox else 2 * i
        b_idx = i + half if neox else 2 * i + 1
        for h in range(x.shape[0]):
            a = x[h, a_idx]
            b = x[h, b_idx]
            x[h, a_idx] = a * cos[i] - b * sin[i]
            x[h, b_idx] = a * sin[i] + b * cos[i]


@njit(**OPS)
def rope_inplace(x, positions, n_rot, base, neox):
    """Rotate the first n_rot dims of every head of x [n, heads, head_dim] in place.

    neox pairs dim i with i + n_rot/2 (GPT-NeoX / Qwen / Gemma); the normal
    style pairs 2i with 2i+1 (llama, whose GGUF q/k rows are permuted for it).
    """
    inv = _inverse_frequencies(n_rot, base)
    cos = np.empty(inv.size, np.float32)
    sin = np.empty(inv.size, np.float32)
    for t in range(x.shape[0]):
        _angles_at(positions[t], inv, cos, sin)
        _rotate(x[t], cos, sin, neox)


@njit(**OPS)
def rope_scaled(x, positions, inv, magnitude, neox):
    """rope_inplace with the pairs' inverse frequencies `inv` given (scaled) and cos, sin times magnitude."""
    cos = np.empty(inv.size, np.float32)
    sin = np.empty(inv.size, np.float32)
    for t in range(x.shape[0]):
        _angles_at(positions[t], inv, cos, sin)
        for i in range(inv.size):
            cos[i] *= magnitude
            sin[i] *= magnitude
        _rotate(x[t], cos, sin, neox)


@njit(**OPS, parallel=True)
def _angles(positions, n_rot, base):
    """cos and sin [n, n_rot/2] float32 of each position's angles."""
    inv = _inverse_frequencies(n_rot, base)
    cos = np.empty((positions.size, inv.size), np.float32)
    sin = np.empty((positions.size, inv.size), np.float32)
    for t in prange(positions.size):
        _angles_at(positions[t], inv, cos[t], sin[t])
    return cos, sin


@lru_cache(maxsize=8)
def _angle_table(positions: bytes, n_rot: int, base: float):
    # a prefill rotates the queries and then the keys of every layer at the same positions: their libm
    # cos and sin, not the rotation, are the cost, so they are computed once per forward and rope base
    return _angles(np.frombuffer(positions, np.int64), n_rot, base)


@njit(**OPS, parallel=True)
def _rope_parallel(x, cos, sin, neox):
    for t in prange(x.shape[0]):
        _rotate(x[t], cos[t], sin[t], neox)


def scaled_frequencies(n_rot: int, base: float, scaling) -> np.ndarray:
    """Each rotated pair's inverse frequency (float64 [n_rot / 2]) under a kernels.backend.RopeScaling."""
    return base ** (-2.0 * np.arange(n_rot // 2) / n_rot) * scaling.angle_factors(n_rot, base)


def rope(x: np.ndarray, positions: np.ndarray, n_rot: int, base: float, neox: bool, scaling=None) -> None:
    """Apply rotary position embedding in place to x [n, heads, head_dim]; scaling: a
    kernels.backend.RopeScaling, or None."""
    positions = positions.astype(np.int64, copy=False)
    if scaling is not None:
        rope_scaled(x, positions, scaled_frequencies(n_rot, base, scaling), np.float32(scaling.magnitude()), bool(neox))
        return
    if x.size < _PARALLEL_ELEMENTS:
        rope_inplace(x, positions, n_rot, float(base), bool(neox))
    else:
        _rope_parallel(x, *_angle_table(positions.tobytes(), n_rot, float(base)), bool(neox))


@njit(**OPS, inline="always")
def _silu(v):
    return v / (np.float32(1.0) + exp32(-v))


_GELU_C2 = np.float32(2.0 * math.sqrt(2.0 / math.pi))


@njit(**OPS, inline="always")
def _gelu_tanh(v):
    # 0.5 v (1 + tanh(u)) written as v / (1 + exp(-2u)): one vectorized exp instead of a libm tanh
    return v / (np.float32(1.0) + exp32(-_GELU_C2 * (v + np.float32(0.044715) * v * v * v)))


SILU, GELU, SIGMOID = 0, 1, 2


@njit(**OPS, inline="always")
def gated_range(act, g, u, o, start, stop):
    if act == SILU:
        for i in range(start, stop):
            o[idx(i)] = _silu(g[idx(i)]) * u[idx(i)]
    elif act == SIGMOID:
        for i in range(start, stop):
            o[idx(i)] = u[idx(i)] / (np.float32(1.0) + exp32(-g[idx(i)]))
    else:
        for i in range(start, stop):
            o[idx(i)] = _gelu_tanh(g[idx(i)]) * u[idx(i)]


@njit(**OPS)
def _gated(act, g, u, o):
    gated_range(act, g, u, o, 0, g.size)


_GATED_CHUNK = 1 << 14  # elements per task of the parallel split: whole vectors for the loop vectorizer


@njit(**OPS, parallel=True)
def _gated_parallel(act, g, u, o):
    for c in prange((g.size + _GATED_CHUNK - 1) // _GATED_CHUNK):
        gated_range(act, g, u, o, c * _GATED_CHUNK, min(g.size, (c + 1) * _GATED_CHUNK))


def _apply_gated(act, gate, up, out):
    """activation(gate) * up elementwise."""
    if out is None:
        out = np.empty_like(gate)
    g, u = np.ascontiguousarray(gate).reshape(-1), np.ascontiguousarray(up).reshape(-1)
    kernel = _gated_parallel if g.size >= _PARALLEL_ELEMENTS else _gated
    kernel(act, g, u, out.reshape(-1))
    return out


def silu_mul(gate: np.ndarray, up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """SwiGLU: silu(gate) * up."""
    return _apply_gated(SILU, gate, up, out)


def sigmoid_mul(gate: np.ndarray, up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """sigmoid(gate) * up: a gated attention output (Qwen3.5's full-attention layers)."""
    return _apply_gated(SIGMOID, gate, up, out)


def gelu_mul(gate: np.ndarray, up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """GeGLU with the tanh approximation of GELU (what Gemma and llama.cpp use)."""
    return _apply_gated(GELU, gate, up, out)


OAI_ALPHA, OAI_LIMIT = np.float32(1.702), np.float32(7.0)  # gpt-oss's SwiGLU constants (llama.cpp's)


@njit(**OPS)
def swiglu_oai_into(g, u, alpha, limit, o):
    for i in range(g.size):
        x = min(g[i], limit)
        y = min(max(u[i], -limit), limit)
        o[i] = x / (np.float32(1.0) + np.exp(alpha * -x)) * (y + np.float32(1.0))


def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float = OAI_ALPHA, limit: float = OAI_LIMIT) -> np.ndarray:
    """gpt-oss's clamped SwiGLU, as ggml_swiglu_oai: x = min(gate, limit), y = up clamped to ±limit,
    x * sigmoid(alpha * x) * (y + 1) (libm's expf, as ggml's scalar loop)."""
    g, u = np.ascontiguousarray(gate, np.float32), np.ascontiguousarray(up, np.float32)
    out = np.empty_like(g)
    swiglu_oai_into(g.reshape(-1), u.reshape(-1), np.float32(alpha), np.float32(limit), out.reshape(-1))
    return out


@njit(**OPS, inline="always")
def _widen_row(bits, out):
    for c in range(bits.shape[0]):
        out[idx(c)] = f16_bits_to_f32(bits[idx(c)])


@njit(**OPS)
def _widen_f16_serial(bits, out):
    for r in range(bits.shape[0]):
        _widen_row(bits[r], out[r])


@njit(**OPS, parallel=True)
def _widen_f16_parallel(bits, out):
    for r in prange(bits.shape[0]):
        _widen_row(bits[r], out[r])


def widen_f16(bits: np.ndarray) -> np.ndarray:
    """f16 bit patterns (uint16 [..., n]) as float32: exact, by F16C (NumPy's astype from float16 converts a
    value at a time: 5 ms for the keys and values of one 2,036-position Qwen3.5 layer, at every prefill call)."""
    rows = np.ascontiguousarray(bits).reshape(-1, bits.shape[-1])
    out = np.empty(rows.shape, np.float32)
    (_widen_f16_parallel if rows.size >= _PARALLEL_ELEMENTS else _widen_f16_serial)(rows, out)
    return out.reshape(bits.shape)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax (NumPy; used off the per-token hot path)."""
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)
