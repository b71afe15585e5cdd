"""The CUDA kernels behind CudaBackend: products over GGUF blocks, norms, RoPE, activations, attention.

Every value is computed by a thread that sees only its own row, so a row's result does not depend on the
other rows of a launch: the row-wise property (decode, verification) holds on the device too. Prefill
products use a tiled kernel instead (shared-memory tiles of the input and of decoded weight rows), whose
sums run in another order. Sums are float32.

One thread per output value (matvec, norms, attention) keeps the kernels free of block barriers, which
is also what keeps them testable in the simulator; on hardware a warp per output with a shuffle reduction
reads the weight rows coalesced and is the next step.
"""

import functools
import math
from typing import NamedTuple

from numba import cuda, float32, int32

from kernels.cuda.formats import DECODERS

THREADS = 32  # threads per block of the one-thread-per-value kernels
TILE = 16  # the tiled product's output tile is TILE x TILE, its k-step TILE columns
ELEMENTS = 128  # threads per block of the elementwise kernels


class Products(NamedTuple):
    """The kernels reading weights of one GGML type."""

    matvec: object  # row-wise products, a thread per output
    matmul: object  # tiled products (prefill)
    gather: object  # the embedding lookup


@functools.cache
def products(qtype: int) -> Products:
    decode = DECODERS[qtype]

    @cuda.jit
    def matvec(w, x, bias, y):
        """y[i, r] = W[r] . x[i] + bias[r], thread (r, i)."""
        r, i = cuda.grid(2)
        if r < y.shape[1] and i < y.shape[0]:
            acc = float32(0)
            for c in range(x.shape[1]):
                acc += decode(w, r, c) * x[i, c]
            y[i, r] = acc + bias[r]

    @cuda.jit
    def matmul(w, x, bias, y):
        """y = x @ W.T + bias, one TILE x TILE block of y per thread block."""
        xs = cuda.shared.array((TILE, TILE), float32)
        ws = cuda.shared.array((TILE, TILE), float32)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        i0, r0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
        n, cols, rows = x.shape[0], x.shape[1], y.shape[1]
        acc = float32(0)
        for c0 in range(0, cols, TILE):
            c = c0 + tx
            xs[ty, tx] = x[i0 + ty, c] if i0 + ty < n and c < cols else float32(0)
            ws[ty, tx] = decode(w, r0 + ty, c) if r0 + ty < rows and c < cols else float32(0)
            cuda.syncthreads()
            for k in range(TILE):
                acc += xs[ty, k] * ws[tx, k]
            cuda.syncthreads()
        if i0 + ty < n and r0 + tx < rows:
            y[i0 + ty, r0 + tx] = acc + bias[r0 + tx]

    @cuda.jit
    def gather(w, ids, scale, out):
        """out[i] = W[ids[i]] * scale (the embedding lookup)."""
        i = cuda.blockIdx.x
        for c in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
            out[i, c] = decode(w, ids[i], c) * scale

    return Products(matvec, matmul, gather)


@cuda.jit
def rmsnorm(x, w, eps, out):
    """Thread (run, row): out = x * rsqrt(mean(x^2) + eps) * w over run `run` (len(w) values) of the row."""
    run, i = cuda.grid(2)
    d = w.shape[0]
    if i < x.shape[0] and run < x.shape[1] // d:
        o = run * d
        acc = float32(0)
        for c in range(d):
            acc += x[i, o + c] * x[i, o + c]
        scale = float32(1) / math.sqrt(acc / float32(d) + eps)
        for c in range(d):
            out[i, o + c] = x[i, o + c] * scale * w[c]


@cuda.jit
def rope(x, positions, head_dim, n_rot, base, neox):
    """In place, block (row, head), a thread per rotated pair; angles in float64 as the CPU's."""
    i, h = cuda.blockIdx.x, cuda.blockIdx.y
    half = n_rot // 2
    for p in range(cuda.threadIdx.x, half, cuda.blockDim.x):
        theta = positions[i] * base ** (-2.0 * p / n_rot)
        c, s = float32(math.cos(theta)), float32(math.sin(theta))
        a_idx = h * head_dim + (p if neox else 2 * p)
        b_idx = h * head_dim + (p + half if neox else 2 * p + 1)
        a, b = x[i, a_idx], x[i, b_idx]
        x[i, a_idx] = a * c - b * s
        x[i, b_idx] = a * s + b * c


_GELU_C2 = float32(2.0 * math.sqrt(2.0 / math.pi))


@cuda.jit
def gated(gelu, g, u, out):
    """out = act(g) * u, act SiLU or GELU (tanh form, as the CPU writes it)."""
    i = cuda.blockIdx.x
    for c in range(cuda.blockIdx.y * ELEMENTS + cuda.threadIdx.x, g.shape[1], cuda.gridDim.y * ELEMENTS):
        v = g[i, c]
        arg = _GELU_C2 * (v + float32(0.044715) * v * v * v) if gelu else v
        out[i, c] = v / (float32(1) + math.exp(-arg)) * u[i, c]


@cuda.jit
def add(x, y, out):
    i = cuda.blockIdx.x
    for c in range(cuda.blockIdx.y * ELEMENTS + cuda.threadIdx.x, x.shape[1], cuda.gridDim.y * ELEMENTS):
        out[i, c] = x[i, c] + y[i, c]


@cuda.jit
def take_rows(x, rows, out):
    i = cuda.blockIdx.x
    for c in range(cuda.threadIdx.x, x.shape[1], cuda.blockDim.x):
        out[i, c] = x[rows[i], c]


@functools.cache
def cache_kernels(q8_0: bool):
    """(kv_write, attention) for an f16 cache (values [capacity, kv_heads, head_dim], the scales unused) or a
    q8_0 one (int8 values and one f16 scale per 32 of them, [capacity, kv_heads, head_dim / 32])."""
    if q8_0:
        @cuda.jit(device=True, inline=True)
        def write_head(x, o, d, values, scales, pos, h):
            """Quantize x[o:o + d] as GGML's block_q8_0 does: scale = max|x| / 127, round half away from 0."""
            for b in range(d // 32):
                amax = float32(0)
                for j in range(32):
                    amax = max(amax, abs(x[o + b * 32 + j]))
                scale = amax / float32(127)
                inv = float32(1) / scale if scale != 0 else float32(0)
                scales[pos, h, b] = scale
                for j in range(32):
                    v = x[o + b * 32 + j] * inv
                    values[pos, h, b * 32 + j] = int32(v + math.copysign(float32(0.5), v))  # toward 0

        @cuda.jit(device=True, inline=True)
        def read(values, scales, j, h, c):
            return float32(values[j, h, c]) * float32(scales[j, h, c // 32])
    else:
        @cuda.jit(device=True, inline=True)
        def write_head(x, o, d, values, scales, pos, h):
            for c in range(d):
                values[pos, h, c] = x[o + c]

        @cuda.jit(device=True, inline=True)
        def read(values, scales, j, h, c):
            return float32(values[j, h, c])

    @cuda.jit
    def kv_write(k, v, kc, ks, vc, vs, pos0):
        """Thread (row i, kv head h): rows i of k, v [rows, kv_heads * head_dim] to cache position pos0 + i."""
        i, h = cuda.blockIdx.x, cuda.threadIdx.x
        d = kc.shape[2]
        write_head(k[i], h * d, d, kc, ks, pos0 + i, h)
        write_head(v[i], h * d, d, vc, vs, pos0 + i, h)

    @cuda.jit
    def attention(q, kc, ks, vc, vs, pos0, window, scale, out):
        """Thread (row i, head h): softmax(scale * q . k) v over the keys row i sees (positions up to pos0 + i,
        the last `window` of them when window > 0), in one pass with a running maximum."""
        i, h = cuda.blockIdx.x, cuda.threadIdx.x
        n_head, d = cuda.blockDim.x, kc.shape[2]
        kvh = h // (n_head // kc.shape[1])
        pos = pos0 + i
        start = pos - window + 1 if window > 0 and pos + 1 > window else 0
        base = h * d
        for c in range(d):
            out[i, base + c] = float32(0)
        top, total = float32(-math.inf), float32(0)
        for j in range(start, pos + 1):
            s = float32(0)
            for c in range(d):
                s += q[i, base + c] * read(kc, ks, j, kvh, c)
            s *= scale
            new_top = max(top, s)
            rescale = math.exp(top - new_top)
            p = math.exp(s - new_top)
            total = total * rescale + p
            for c in range(d):
                out[i, base + c] = out[i, base + c] * rescale + p * read(vc, vs, j, kvh, c)
            top = new_top
        inv = float32(1) / total
        for c in range(d):
            out[i, base + c] *= inv

    return kv_write, attention
