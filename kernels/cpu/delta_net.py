"""The gated delta rule (Qwen3.5's linear-attention mixer, llama.cpp's ggml_ssm_conv + ggml_gated_delta_net)
over one conversation's rows, on its recurrent state.

Per row t, from the row's mixed projection [q | k | v] (conv channels), its alpha and beta logits:
- the short causal convolution: channel c's output is its kernel over the last d_conv inputs (the state's
  d_conv - 1, then this row's), then SiLU; the window slides by one;
- q and k per head scaled to unit length (ggml's rms_norm(x, eps/n) / sqrt(n));
- beta = sigmoid(beta logit), the decay exp(g) with g = softplus(alpha + dt_bias) * a (a = -exp(A_log));
- per value head h (its q/k head h % n_k, as ggml's repeat): S *= exp(g); d = (v - S k) * beta;
  S += d k^T; out = S q / sqrt(head size). S is [head_v (j), head_k (i)]; it is stored key-major ([i, j]).

Rows run one after another (the recurrence), each with the same arithmetic whatever the call's row count, so
m rows are bitwise m single steps: the row-wise contract holds with no separate decode kernel. The heads
split over the threads (each owns its state). With `snapshots`, the state after every row is kept (a
speculative verify rolls back to any of its rows).
"""

import numpy as np
from numba import njit, prange

from kernels.cpu.fast_exp import exp32

_OPTS = dict(cache=True, error_model="numpy")


@njit(**_OPTS, parallel=True)
def _conv_rows(mixed, conv_w, conv_state, out, conv_snaps):
    """Causal conv + SiLU of every channel over the rows, a row per task (its channels contiguous): row t reads
    positions t .. t + d_conv - 1 of [conv_state; mixed]; then conv_state [d_conv - 1, channels] slides on. With
    conv_snaps [m, d_conv - 1, channels] (non-empty) keeps the window after each row. conv_w [d_conv, channels]."""
    m, channels = mixed.shape
    taps = conv_w.shape[0]
    keep = conv_snaps.shape[0] > 0
    for t in prange(m):
        o = out[t]
        for c in range(channels):
            o[c] = 0
        for i in range(taps):
            k = t + i
            row = conv_state[k] if k < taps - 1 else mixed[k - (taps - 1)]
            w = conv_w[i]
            for c in range(channels):
                o[c] += row[c] * w[c]
        for c in range(channels):
            o[c] = o[c] / (np.float32(1.0) + exp32(-o[c]))
        if keep:
            for i in range(taps - 1):
                k = t + 1 + i
                conv_snaps[t, i] = conv_state[k] if k < taps - 1 else mixed[k - (taps - 1)]
    last = np.empty((taps - 1, channels), np.float32)
    for i in range(taps - 1):
        k = m + i
        last[i] = conv_state[k] if k < taps - 1 else mixed[k - (taps - 1)]
    conv_state[:] = last


@njit(**_OPTS, inline="always")
def _unit(x, start, n, eps):
    """x[start:start+n] scaled to unit length, in place: ggml's rms_norm(x, eps/n) then * 1/sqrt(n)."""
    ss = 0.0
    for i in range(n):
        ss += np.float64(x[start + i]) * np.float64(x[start + i])
    mean = np.float32(ss / n)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps / n))
    root = np.float32(1.0) / np.sqrt(np.float32(n))
    for i in range(n):
        x[start + i] = x[start + i] * scale * root


@njit(**_OPTS, parallel=True)
def _delta_heads(conv_out, alpha, beta, dt_bias, a, n_k, head, eps, state, out, ssm_snaps):
    """The delta rule over the rows, a value head per task. conv_out [m, 2 n_k head + n_v head] (q, k made unit
    here, in place, before any head reads them). A head's state is kept key-major, state[h, i, j] = S[j][i]:
    every loop below runs over j, contiguous, each j's sum over i in order of i, so the loops vectorize with
    no reassociation (the bits are those of the plain loops). The state is read once and written once a row:
    with S' = decay S + k d^T, S' q = decay (S q) + (k . q) d, and the delta d = v - decay (S k), times beta."""
    m = conv_out.shape[0]
    n_v = state.shape[0]
    keep = ssm_snaps.shape[0] > 0
    key_width = n_k * head
    for t in prange(m * n_k * 2):
        row, which = t // (n_k * 2), t % (n_k * 2)
        _unit(conv_out[row], which * head, head, eps)
    scale = np.float32(1.0) / np.sqrt(np.float32(head))
    for h in prange(n_v):
        s = state[h]
        kh = h % n_k
        sk = np.empty(head, np.float32)
        sq = np.empty(head, np.float32)
        for t in range(m):
            x = conv_out[t]
            b = np.float32(1.0) / (np.float32(1.0) + exp32(-beta[t, h]))
            z = alpha[t, h] + dt_bias[h]
            soft = z if z > np.float32(20.0) else np.float32(np.log(np.float32(1.0) + np.exp(z)))
            decay = np.float32(np.exp(soft * a[h]))
            q0, k0, v0 = kh * head, key_width + kh * head, 2 * key_width + h * head
            sk[:] = 0
            sq[:] = 0
            kq = np.float32(0.0)
            for i in range(head):  # S k and S q of the state before this row: one read of it
                ki, qi = x[k0 + i], x[q0 + i]
                kq += ki * qi
                for j in range(head):
                    sk[j] += s[i, j] * ki
                    sq[j] += s[i, j] * qi
            for j in range(head):  # the delta (sk becomes it) and the output, from the decayed state's
                sk[j] = (x[v0 + j] - decay * sk[j]) * b
                out[t, h * head + j] = (decay * sq[j] + kq * sk[j]) * scale
            for i in range(head):  # S = decay S + k d^T: one read and write of it
                ki = x[k0 + i]
                for j in range(head):
                    s[i, j] = s[i, j] * decay + ki * sk[j]
            if keep:
                ssm_snaps[t, h] = s


def delta_net_rows(mixed: np.ndarray, alpha: np.ndarray, beta: np.ndarray, dt_bias: np.ndarray, a: np.ndarray,
                   conv_w: np.ndarray, n_k: int, head: int, eps: float, conv_state: np.ndarray,
                   ssm_state: np.ndarray, snapshots: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """One conversation's rows through the mixer's recurrence: mixed [m, channels] (the attn_qkv product),
    alpha, beta [m, n_v] logits, conv_w [d_conv, channels]; updates conv_state [d_conv - 1, channels] and ssm_state [n_v, head, head] in
    place; snapshots (conv [m, d_conv - 1, channels], ssm [m, n_v, head, head]) receive the state after each
    row. Returns [m, n_v * head]. (The state's layout is [value head, key dim, value dim].)"""
    m = mixed.shape[0]
    n_v = ssm_state.shape[0]
    conv_out = np.empty_like(mixed)
    no_conv = np.empty((0, 0, 0), np.float32)
    no_ssm = np.empty((0, 0, 0, 0), np.float32)
    conv_snaps, ssm_snaps = snapshots if snapshots is not None else (no_conv, no_ssm)
    _conv_rows(np.ascontiguousarray(mixed), conv_w, conv_state, conv_out, conv_snaps)
    out = np.empty((m, n_v * head), np.float32)
    _delta_heads(conv_out, np.ascontiguousarray(alpha), np.ascontiguousarray(beta), dt_bias, a, n_k, head,
                 np.float32(eps), ssm_state, out, ssm_snaps)
    return out
