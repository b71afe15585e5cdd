"""The fused decode layer equals the same steps run one kernel at a time."""

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from kernels.cpu import ops, quant
from kernels.cpu.attention import attention_decode
from kernels.cpu.decode import decode_layer
from tests.quant_weights import random_weight

E, HEADS, KV, HD, FF, POS = 64, 4, 2, 16, 96, 9
# q/k/v of mixed formats stack into one pass; down is a K-quant-free int8 format
QTYPES = (T.F16, T.Q8_0, T.F32, T.Q4_0, T.Q5_0, T.Q8_0, T.Q4_1)
SHAPES = ((HEADS * HD, E), (KV * HD, E), (KV * HD, E), (E, HEADS * HD), (FF, E), (FF, E), (E, FF))

VARIANTS = {  # name: (activation, window, biases, q/k norms, post norms, neox)
    "llama": (ops.SILU, 0, False, False, False, False),
    "qwen2": (ops.SILU, 0, True, False, False, True),
    "gemma3": (ops.GELU, 4, False, True, True, True),
}


def _layer(variant, rng):
    act, window, bias, qk_norm, post, neox = VARIANTS[variant]
    ws = tuple(quant.kernel_weight(t, random_weight(t, r, c, rng)) for t, (r, c) in zip(QTYPES, SHAPES))

    def vec(n, on=True):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32) if on else np.zeros(0, np.float32)

    vecs = (vec(E), vec(E), vec(E, post), vec(E, post), vec(HD, qk_norm), vec(HD, qk_norm),
            vec(HEADS * HD, bias), vec(KV * HD, bias), vec(KV * HD, bias))
    geo = np.array([HEADS, KV, HD, HD, neox, act, window], np.int64)
    return ws, np.array(QTYPES, np.int64), vecs, geo, 1e-6, 10000.0, 0.25


def _reference(x, layer, kc, vc):
    """The layer through the separate kernels, the cache written as KvCache encodes it."""
    ws, qtypes, vecs, geo, eps, base, scale = layer
    neox, act, window = bool(geo[4]), geo[5], geo[6]
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
    ops.rope(q, np.array([POS]), HD, base, neox)
    ops.rope(k, np.array([POS]), HD, base, neox)
    kc[POS], vc[POS] = k[0].astype(np.float16).view(np.uint16), v.astype(np.float16).view(np.uint16)
    a = norm(mv[3](attention_decode(q[0], kc, vc, POS + 1, window, scale).reshape(-1)), vecs[2])
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
    decode_layer(x, *layer, kc, vc, POS, 2)
    np.testing.assert_array_equal(kc, kc_ref)
    np.testing.assert_array_equal(vc, vc_ref)
    np.testing.assert_allclose(x, expected, rtol=1e-5, atol=1e-5)
