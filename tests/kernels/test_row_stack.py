"""The row-wise layer kernel: equal to the same steps run one kernel at a time, and m rows in one call
bitwise equal to m one-row calls."""

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from kernels.backend import RopeScaling
from kernels.common import formats
from kernels.cpu import ops, quant
from kernels.cpu.attention import attention_decode
from numba import typed

from kernels.cpu.row_stack import Layer, Mlp, forward_rows
from kernels.cpu.quant_dot import stack
from tests.quant_weights import random_weight

E, HEADS, KV, HD, FF, POS = 64, 4, 2, 16, 96, 9
# q/k/v of mixed formats stack into one pass; down is a K-quant-free int8 format
QTYPES = (T.F16, T.Q8_0, T.F32, T.Q4_0, T.Q5_0, T.Q8_0, T.Q4_1)
YARN = RopeScaling(factor=32.0, yarn=True, n_ctx_orig=4096)
SHAPES = ((HEADS * HD, E), (KV * HD, E), (KV * HD, E), (E, HEADS * HD), (FF, E), (FF, E), (E, FF))

VARIANTS = {  # name: (activation, window, biases, q/k norms, post norms, neox, sinks + output bias + YaRN)
    "llama": (ops.SILU, 0, False, False, False, False, False),
    "qwen2": (ops.SILU, 0, True, False, False, True, False),
    "gemma3": (ops.GELU, 4, False, True, True, True, False),
    "gpt-oss": (ops.SILU, 4, True, False, False, True, True),
}


def _layer(variant, rng):
    act, window, bias, qk_norm, post, neox, oss = VARIANTS[variant]
    ws = tuple(quant.kernel_weight(t, random_weight(t, r, c, rng)) for t, (r, c) in zip(QTYPES, SHAPES))

    def vec(n, on=True):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32) if on else np.zeros(0, np.float32)

    (qkv_types, qkv), (out_types, out), (gate_up_types, gate_up), (down_types, down) = (
        stack(QTYPES[a:b], ws[a:b]) for a, b in ((0, 3), (3, 4), (4, 6), (6, 7)))
    ffn = Mlp(gate_up=gate_up, gate_up_types=gate_up_types, down=down, down_types=down_types, activation=act)
    return Layer(qkv=qkv, qkv_types=qkv_types, out=out, out_types=out_types, ffn=ffn, attn_norm=vec(E),
                 ffn_norm=vec(E), post_attn_norm=vec(E, post), post_ffn_norm=vec(E, post), q_norm=vec(HD, qk_norm),
                 k_norm=vec(HD, qk_norm), q_bias=vec(HEADS * HD, bias), k_bias=vec(KV * HD, bias),
                 v_bias=vec(KV * HD, bias), out_bias=vec(E, oss), sinks=vec(HEADS, oss), n_head=HEADS, n_kv=KV,
                 head_dim=HD, rope_dims=HD, rope_neox=neox, rope_base=10000.0,
                 rope_inv=ops.scaled_frequencies(HD, 10000.0, YARN) if oss else np.zeros(0),
                 rope_magnitude=YARN.magnitude(),
                 window=window, eps=1e-6, attn_scale=0.25)


def _reference(x, layer, kc, vc):
    """The layer through the separate kernels, the cache written as KvCache encodes it."""
    ws = [w for w in (*layer.qkv, *layer.out, *layer.ffn.gate_up, *layer.ffn.down) if w.size]  # without the padding
    qtypes = QTYPES
    eps, base, scale, neox, act, window = (layer.eps, layer.rope_base, layer.attn_scale, layer.rope_neox,
                                           layer.ffn.activation, layer.window)
    vecs = (layer.attn_norm, layer.ffn_norm, layer.post_attn_norm, layer.post_ffn_norm, layer.q_norm,
            layer.k_norm, layer.q_bias, layer.k_bias, layer.v_bias)
    mv = [lambda v, w=w, t=t: quant.matvec(int(t), w, v) for w, t in zip(ws, qtypes)]

    def norm(v, w):
        return ops.rmsnorm(v[None], w, eps)[0] if w.size else v

    h = norm(x, vecs[0])
    q, k, v = mv[0](h), mv[1](h), mv[2](h)
    if vecs[6].size:
        q, k, v = q + vecs[6], k + vecs[7], v + vecs[8]
    q, k, v = q.reshape(1, HEADS, HD), k.reshape(1, KV, HD), v.reshape(KV, HD)
    if vecs[4].size:
        q, k = ops.rmsnorm(q, vecs[4], eps), ops.rmsnorm(k, vecs[5], eps)
    scaling = YARN if layer.rope_inv.size else None
    ops.rope(q, np.array([POS]), HD, base, neox, scaling)
    ops.rope(k, np.array([POS]), HD, base, neox, scaling)
    kc[POS], vc[POS] = k[0].astype(np.float16).view(np.uint16), v.astype(np.float16).view(np.uint16)
    o = mv[3](attention_decode(q[0], kc, vc, POS + 1, window, scale, sinks=layer.sinks).reshape(-1))
    a = norm(o + layer.out_bias if layer.out_bias.size else o, vecs[2])
    x = x + a
    gated = (ops.gelu_mul if act == ops.GELU else ops.silu_mul)(mv[4](norm(x, vecs[1])), mv[5](norm(x, vecs[1])))
    return x + norm(mv[6](gated), vecs[3])


@pytest.mark.parametrize("variant", VARIANTS)
def test_fused_layer_equals_separate_kernels(variant):
    rng = np.random.default_rng(3)
    layer = _layer(variant, rng)
    kc = rng.standard_normal((POS + 3, KV, HD)).astype(np.float16).view(np.uint16)
    vc = rng.standard_normal((POS + 3, KV, HD)).astype(np.float16).view(np.uint16)
    x = rng.standard_normal(E).astype(np.float32)
    kc_ref, vc_ref = kc.copy(), vc.copy()
    expected = _reference(x, layer, kc_ref, vc_ref)
    rows = x[None].copy()
    _run(rows, layer, kc, vc, POS)
    np.testing.assert_array_equal(kc, kc_ref)
    np.testing.assert_array_equal(vc, vc_ref)
    np.testing.assert_allclose(rows[0], expected, rtol=1e-5, atol=1e-5)


def _run(rows, layer, kc, vc, pos0, threads=2):
    m = rows.shape[0]
    forward_rows(formats.of(QTYPES), rows, typed.List([layer]), typed.List([kc]), typed.List([vc]),
                 np.zeros(m, np.int64), np.arange(pos0, pos0 + m, dtype=np.int64), threads)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("threads", [1, 2])
def test_rows_in_one_call_equal_rows_one_at_a_time(variant, threads):
    rng = np.random.default_rng(5)
    layer = _layer(variant, rng)
    m, pos0 = 9, 3
    kc = rng.standard_normal((pos0 + m, KV, HD)).astype(np.float16).view(np.uint16)
    vc = rng.standard_normal((pos0 + m, KV, HD)).astype(np.float16).view(np.uint16)
    x = rng.standard_normal((m, E)).astype(np.float32)
    one_kc, one_vc, one = kc.copy(), vc.copy(), x.copy()
    for i in range(m):
        row = one[i : i + 1].copy()
        _run(row, layer, one_kc, one_vc, pos0 + i, threads=1)
        one[i] = row[0]
    _run(x, layer, kc, vc, pos0, threads)
    np.testing.assert_array_equal(x, one)
    np.testing.assert_array_equal(kc, one_kc)
    np.testing.assert_array_equal(vc, one_vc)
