"""Every weight format through a real file: gguf.GGUFWriter -> engine reader (mmap views) -> kernels."""

import gguf
import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

from engine.gguf.reader import open_gguf
from kernels.cpu import quant
from tests.quant_weights import matvec_input, random_weight

FORMATS = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K,
           T.Q6_K, T.IQ4_NL, T.TQ2_0, T.MXFP4]
ROWS, COLS = 6, 256


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory):
    """A GGUF holding one [ROWS, COLS] tensor per format, and the bytes written for each."""
    path = tmp_path_factory.mktemp("formats") / "formats.gguf"
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    written = {}
    for qtype in FORMATS:
        raw = random_weight(qtype, ROWS, COLS, rng)
        written[qtype] = raw
        if qtype == T.F32:
            writer.add_tensor(qtype.name, raw.view(np.float32))
        elif qtype == T.F16:
            writer.add_tensor(qtype.name, raw.view(np.float16))
        else:
            writer.add_tensor(qtype.name, raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open_gguf(path) as f:
        yield f, written


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_weight_format_round_trip(weights_file, qtype):
    f, written = weights_file
    info = f.tensor(qtype.name)
    raw = f.raw(info)
    assert info.ggml_type == qtype and info.shape == (ROWS, COLS)
    assert raw.dtype == np.uint8 and raw.shape == written[qtype].shape and not raw.flags.writeable
    np.testing.assert_array_equal(raw, written[qtype])

    W = quants.dequantize(raw, qtype).astype(np.float64)
    rng = np.random.default_rng(1)
    X = matvec_input(qtype, rng.standard_normal((5, COLS), dtype=np.float32))  # exact for int8 inputs
    bound = 1e-4 * (np.abs(X).astype(np.float64) @ np.abs(W).T) + 1e-30
    assert np.all(np.abs(quant.matmul(info.ggml_type, raw, X) - X @ W.T) <= bound)
    assert np.all(np.abs(quant.matvec(info.ggml_type, raw, X[0]) - W @ X[0]) <= bound[0])
    ids = np.array([5, 0, 2])
    np.testing.assert_allclose(quant.gather_rows(info.ggml_type, raw, ids), W[ids], rtol=2e-7, atol=1e-9)
