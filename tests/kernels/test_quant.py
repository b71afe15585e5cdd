"""Quantized-weight kernels against gguf.quants' reference dequantizers and float64 NumPy."""

import numba
import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

from kernels.common import gguf_weights
from kernels.cpu import int8_dot, lane_gemm, quant
from tests.quant_weights import matvec_input, random_weight, super_block_input

NATIVE = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
          T.MXFP4]
GENERIC = [T.IQ4_NL, T.TQ2_0]
# Columns: several blocks, and for float formats a width that is no multiple of 16.
COLS = {T.F32: 37, T.F16: 53, T.BF16: 40, T.Q4_0: 160, T.Q4_1: 96, T.Q5_0: 160, T.Q5_1: 96, T.Q8_0: 224,
        T.IQ4_NL: 96, T.MXFP4: 64}
ROWS = 7


def _cols(qtype):
    return COLS.get(qtype, 512)


@pytest.fixture(params=["serial", "threads"])
def mode(request, monkeypatch):
    """Run each case on the calling thread and split over threads (even for tiny weights)."""
    if request.param == "threads":
        monkeypatch.setattr(quant, "_PARALLEL_MIN_BYTES", 0)
        if numba.get_num_threads() < 2:
            pytest.skip("needs 2 threads")
    return request.param


def _case(qtype, rows=ROWS, seed=0):
    rng = np.random.default_rng(seed + int(qtype))
    w = random_weight(qtype, rows, _cols(qtype), rng)
    return w, quants.dequantize(w, qtype).astype(np.float64), rng


def _assert_products(got, W, X):
    """got ~ X @ W.T within float32 accumulation error, relative to the sum of |terms|."""
    ref = X.astype(np.float64) @ W.T
    bound = 2e-6 * np.sqrt(W.shape[1]) * (np.abs(X).astype(np.float64) @ np.abs(W).T) + 1e-30
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert np.all(np.abs(got - ref) <= bound), np.max(np.abs(got - ref) / bound)


def _assert_rows(got, ref):
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=2e-7, atol=1e-7 * np.abs(ref).max(initial=0))


@pytest.mark.parametrize("qtype", NATIVE + GENERIC, ids=lambda t: t.name)
def test_matvec(qtype, mode):
    w, W, rng = _case(qtype)
    x = rng.standard_normal(W.shape[1], dtype=np.float32)
    seen = matvec_input(qtype, x[None])
    _assert_products(quant.matvec(qtype, w, x)[None], W, seen)
    out = np.full(ROWS, np.nan, np.float32)
    assert quant.matvec(qtype, w, x, out) is out
    _assert_products(out[None], W, seen)


@pytest.mark.parametrize("n", [1, 3, 64])
@pytest.mark.parametrize("qtype", NATIVE + GENERIC, ids=lambda t: t.name)
def test_matmul(qtype, n, mode):
    w, W, rng = _case(qtype)
    X = rng.standard_normal((n, W.shape[1]), dtype=np.float32)
    # the row-wise kernels' quantized inputs, and the int8 GEMM's (the same: llama.cpp's); else the float ones
    seen = matvec_input(qtype, X) if n <= quant._MATVEC_MAX_ROWS or lane_gemm.supports(int(qtype)) else X
    _assert_products(quant.matmul(qtype, w, X), W, seen)


@pytest.mark.parametrize("qtype", NATIVE + GENERIC, ids=lambda t: t.name)
def test_gather_and_dequantize(qtype, mode):
    w, W, _ = _case(qtype)
    ids = np.array([3, 0, 6, 3])
    _assert_rows(quant.gather_rows(qtype, w, ids), W[ids])
    _assert_rows(quant.gather_rows(qtype, w, np.array([], dtype=np.int64)), W[:0])
    _assert_rows(gguf_weights.dequantize(qtype, w), W)
    _assert_rows(gguf_weights.dequantize(qtype, w, 2, 5), W[2:5])


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q8_0], ids=lambda t: t.name)
def test_few_row_matmul_covers_every_weight_tile(qtype, mode):
    """Few-row products walk the weight in L2-sized row tiles: many tiles, uneven over threads."""
    w, W, rng = _case(qtype, rows=1201)
    X = rng.standard_normal((5, W.shape[1]), dtype=np.float32)
    _assert_products(quant.matmul(qtype, w, X), W, matvec_input(qtype, X))


def test_matmul_tiles_cover_every_row(monkeypatch):
    """Prefill GEMMs dequantize row tiles: a tile size that does not divide the rows still covers all."""
    monkeypatch.setattr(quant, "_TILE_BYTES", 3 * 512 * 4)
    w, W, rng = _case(T.Q3_K, rows=11)  # a format no integer GEMM takes
    X = rng.standard_normal((quant._MATVEC_MAX_ROWS + 1, 512), dtype=np.float32)
    _assert_products(quant.matmul(T.Q3_K, w, X), W, X)


@pytest.mark.parametrize("qtype", [T.F16, T.Q4_1, T.Q5_0, T.Q8_0, T.Q2_K, T.Q4_K, T.Q6_K, T.IQ4_NL, T.MXFP4],
                         ids=lambda t: t.name)
def test_row_wise_rows_equal_matvecs_bitwise(qtype, mode):
    """quant.rows reads the weight once for all rows, yet each row is bit for bit its own matvec."""
    rng = np.random.default_rng(1)
    cols = _cols(qtype)
    w = random_weight(qtype, 300, cols, rng)
    X = rng.standard_normal((17, cols), dtype=np.float32)
    Y = quant.rows(qtype, w, X)
    for x, y in zip(X, Y):
        np.testing.assert_array_equal(y, quant.matvec(qtype, w, x))


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K, T.MXFP4],
                         ids=lambda t: t.name)
def test_row_tiles_give_every_row_its_one_row_bits(qtype, mode):
    """The m-row kernels unpack each weight block once for a tile of input rows: whatever m, and whatever
    tile and place in it a row lands in, its outputs are the bits of a one-row call."""
    rng = np.random.default_rng(2)
    cols = 768 if qtype in (T.Q4_K, T.Q6_K) else 224  # an odd number of blocks: the kernels pair them
    w = random_weight(qtype, 37, cols, rng)
    X = rng.standard_normal((33, cols), dtype=np.float32)
    one_row = np.stack([quant.rows(qtype, w, x[None])[0] for x in X])
    for m in (1, 2, 3, 4, 5, 8, 17, 33):
        np.testing.assert_array_equal(quant.rows(qtype, w, X[:m]), one_row[:m], err_msg=f"{m} rows")


def test_int8_inputs_are_quantized_as_llama_cpp_does():
    """quantize_row_q8_0's semantics: d = amax / 127, values round(x / d) half away from zero, and the scale
    the dots use rounded to f16 (kept exact where f16 would overflow or flush it to zero)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal(32 * 9, dtype=np.float32) * np.repeat(np.logspace(-30, 30, 9), 32).astype(np.float32)
    x[:32] = 0  # an all-zero block quantizes to zeros with scale 0
    x[32:64] = np.arange(32, dtype=np.float32) - 15.5  # halves: away from zero, not to even
    xq, xd, xsum = int8_dot.quantize(x)
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1) / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = blocks * np.where(d > 0, np.float32(1) / d, 0).astype(np.float32)[:, None]
    np.testing.assert_array_equal(xq.reshape(-1, 32), np.trunc(scaled + np.copysign(np.float32(0.5), scaled)))
    half = d.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(xd, np.where(np.isfinite(half) & ((half > 0) | (d == 0)), half, d))
    np.testing.assert_array_equal(xsum, xq.reshape(-1, 32).sum(axis=1))
    assert xd[0] == 0 and not xq[:32].any()


def test_super_block_inputs_are_quantized_as_llama_cpp_does():
    """quantize_row_q8_K's semantics for the K-quants' inputs: per 256 values iscale = -127 / the value of
    largest magnitude (its sign kept), values round-half-even(iscale * x) in float32, d = 1 / iscale, the sums
    of each 16 values; an all-zero block gives zeros with scale 0."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(256 * 5, dtype=np.float32) * np.repeat(np.logspace(-20, 20, 5), 256).astype(np.float32)
    x[:256] = 0
    x[256] = -1e3  # a negative extreme: iscale positive
    q, d, bsums = super_block_input(x)
    blocks = x.reshape(-1, 256)
    extreme = blocks[np.arange(5), np.abs(blocks).argmax(axis=1)]
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(extreme != 0, np.float32(-127) / extreme, 0).astype(np.float32)
    np.testing.assert_array_equal(q.reshape(-1, 256), np.minimum(127, np.rint(iscale[:, None] * blocks)))
    np.testing.assert_array_equal(d[1:], (np.float32(1) / iscale[1:]).astype(np.float32))
    assert d[0] == 0 and not q[:256].any()
    np.testing.assert_array_equal(bsums, q.reshape(-1, 16).astype(np.int32).sum(axis=1))


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K])
def test_k_quant_dots_are_exact_integer_sums_scaled_once_per_super_block(qtype):
    """Each super-block's dot is an integer (the sub-block scales and the mins or offsets applied in int32),
    scaled by d_w * d_x: against float64 arithmetic on the same values, only the float accumulation of a few
    terms per row rounds."""
    rng = np.random.default_rng(6)
    w = random_weight(qtype, 8, 256 * 4, rng)
    x = rng.standard_normal(256 * 4, dtype=np.float32)
    W = quants.dequantize(w, qtype).reshape(8, -1).astype(np.float64)
    exact = W @ matvec_input(qtype, x[None])[0].astype(np.float64)
    np.testing.assert_allclose(quant.matvec(qtype, w, x), exact, rtol=2e-6, atol=1e-6 * np.abs(exact).max())


def test_mxfp4_decodes_every_code_and_scale_byte_as_gguf_py():
    """Every E8M0 scale byte (0 and 1: subnormal halves, 255: 2^127) with every e2m1 code in both nibbles."""
    blocks = np.zeros((256, 17), np.uint8)
    blocks[:, 0] = np.arange(256)
    blocks[:, 1:] = (np.arange(16, dtype=np.uint8) | (np.arange(16, dtype=np.uint8)[::-1] << 4))
    with np.errstate(over="ignore"):
        expected = quants.dequantize(blocks, T.MXFP4).astype(np.float32)
    np.testing.assert_array_equal(quant.gather_rows(T.MXFP4, blocks, np.arange(256)), expected)


def test_mxfp4_dots_are_exact_integer_sums_scaled_once_per_block():
    """As llama.cpp's vec_dot_mxfp4_q8_0: per block of 32 the integer dot of the doubled e2m1 values with the
    int8 activations, times the halved E8M0 scale and the activations' scale; against float64 arithmetic on
    the same integers only the float accumulation of the blocks rounds."""
    rng = np.random.default_rng(7)
    w = random_weight(T.MXFP4, 9, 32 * 7, rng)  # an odd number of blocks: the kernels pair them
    X = rng.standard_normal((5, 32 * 7), dtype=np.float32)
    W = quants.dequantize(w, T.MXFP4).astype(np.float64)
    exact = matvec_input(T.MXFP4, X).astype(np.float64) @ W.T
    np.testing.assert_allclose(quant.rows(T.MXFP4, w, X), exact, rtol=1e-6, atol=1e-6 * np.abs(exact).max())


def test_f16_scales_decode_every_bit_pattern():
    """F16 weights and f16 block scales decode all 65536 patterns like NumPy (NaN as NaN)."""
    patterns = np.arange(1 << 16, dtype=np.uint16)
    expected = patterns.view(np.float16).astype(np.float32)
    got = gguf_weights.dequantize(T.F16, patterns.view(np.uint8).reshape(1, -1))[0]
    np.testing.assert_array_equal(got, expected)  # treats NaN == NaN
    # One Q8_0 block per pattern, scale = the pattern, every quant = 1: each block decodes to its scale.
    blocks = np.ones((1 << 16, 34), np.uint8)
    blocks[:, :2] = patterns.view(np.uint8).reshape(-1, 2)
    got = gguf_weights.dequantize(T.Q8_0, blocks)
    np.testing.assert_array_equal(got, np.repeat(expected[:, None], 32, axis=1))


def test_large_weight_uses_threads_and_matches():
    rng = np.random.default_rng(2)
    w = random_weight(T.Q6_K, 300, 1024, rng)  # 252 KB: above the parallel threshold
    W = quants.dequantize(w, T.Q6_K).astype(np.float64)
    x = rng.standard_normal(1024, dtype=np.float32)
    _assert_products(quant.matvec(T.Q6_K, w, x)[None], W, matvec_input(T.Q6_K, x[None]))
    _assert_rows(gguf_weights.dequantize(T.Q6_K, w), W)


def test_weights_stay_zero_copy_and_unmodified():
    rng = np.random.default_rng(3)
    w = random_weight(T.Q4_0, ROWS, 64, rng)
    before = w.copy()
    quant.matvec(T.Q4_0, w, np.ones(64, np.float32))
    quant.matmul(T.Q4_0, w, np.ones((20, 64), np.float32))
    np.testing.assert_array_equal(w, before)
    assert w.flags.writeable  # the read-only view used inside is the caller's business, not a change to w


def test_has_native_kernel():
    assert all(gguf_weights.has_native_kernel(t) for t in NATIVE)
    assert not any(gguf_weights.has_native_kernel(t) for t in GENERIC)


def test_set_num_threads():
    before = numba.get_num_threads()
    try:
        quant.set_num_threads(1)
        w, W, rng = _case(T.Q8_0)
        x = rng.standard_normal(W.shape[1], dtype=np.float32)
        _assert_products(quant.matvec(T.Q8_0, w, x)[None], W, matvec_input(T.Q8_0, x[None]))
        with pytest.raises(ValueError, match="thread count"):
            quant.set_num_threads(0)
    finally:
        quant.set_num_threads(before)


# --- errors -----------------------------------------------------------------------


@pytest.mark.parametrize("qtype, name", [(T.I8, "I8"), (T.I32, "I32"), (T.Q8_1, "Q8_1"), (999, "999")])
def test_unsupported_types_name_the_type(qtype, name):
    w = np.zeros((2, 36), np.uint8)
    for call in (lambda: quant.matvec(qtype, w, np.zeros(36, np.float32)),
                 lambda: quant.matmul(qtype, w, np.zeros((2, 36), np.float32)),
                 lambda: quant.gather_rows(qtype, w, np.array([0])),
                 lambda: gguf_weights.dequantize(qtype, w)):
        with pytest.raises(gguf_weights.UnsupportedQuantType, match=name):
            call()
    assert issubclass(gguf_weights.UnsupportedQuantType, ValueError)


def test_input_width_mismatch_names_both_shapes():
    w = random_weight(T.Q8_0, 4, 64, np.random.default_rng(4))
    with pytest.raises(ValueError, match=r"\(65,\).*\(4, 68\)"):
        quant.matvec(T.Q8_0, w, np.zeros(65, np.float32))
    with pytest.raises(ValueError, match=r"\(3, 32\).*\(4, 68\)"):
        quant.matmul(T.Q8_0, w, np.zeros((3, 32), np.float32))


def test_bad_weights_are_refused():
    with pytest.raises(ValueError, match=r"34-byte blocks"):
        quant.matvec(T.Q8_0, np.zeros((2, 35), np.uint8), np.zeros(32, np.float32))
    with pytest.raises(ValueError, match="uint8"):
        quant.matvec(T.F32, np.zeros((2, 8), np.float32), np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        quant.matvec(T.Q8_0, np.zeros((2, 68), np.uint8)[:, :34], np.zeros(32, np.float32))


def test_bad_rows_and_out_are_refused():
    w = random_weight(T.Q4_K, 4, 256, np.random.default_rng(6))
    with pytest.raises(IndexError, match="row 4"):
        quant.gather_rows(T.Q4_K, w, np.array([1, 4]))
    with pytest.raises(IndexError, match="row -1"):
        quant.gather_rows(T.Q4_K, w, np.array([-1]))
    with pytest.raises(ValueError, match=r"\[3, 5\)"):
        gguf_weights.dequantize(T.Q4_K, w, 3, 5)
    with pytest.raises(ValueError, match="out"):
        quant.matvec(T.Q4_K, w, np.zeros(256, np.float32), out=np.zeros(3, np.float32))


def test_the_two_stream_order_computes_every_weight_row_once():
    """Rows r and half + r in turn: a permutation of the rows for every count, odd or even."""
    from kernels.cpu.quant_dot import stream_row

    for n in range(12):
        order = [stream_row(n, i) for i in range(n)]
        assert sorted(order) == list(range(n)), n
        if n > 1:
            assert order[:2] == [0, (n + 1) // 2], n
