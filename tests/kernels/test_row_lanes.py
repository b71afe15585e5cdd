"""Products of several input rows with 16 weight rows in vector lanes give every output the bits of the
one-row kernels, for each format they take (row_lanes: the 32-weight formats; k_quant_lanes: Q4_K and Q6_K),
with weight rows left over past the last 16 and over threads."""

import gguf
import numpy as np
import pytest
from numba import njit

import engine  # noqa: F401  (sets up Numba's threads before the kernels load)
from kernels.common import quant_blocks as qb
from kernels.common.formats import of as formats_of
from kernels.cpu import k_quant_lanes, quant_dot, row_lanes
from tests.quant_weights import random_weight

FORMATS = {"Q4_0": qb.Q4_0, "Q5_0": qb.Q5_0, "Q4_1": qb.Q4_1, "Q5_1": qb.Q5_1, "Q4_K": qb.Q4_K, "Q6_K": qb.Q6_K}
COLS = 768  # three K-quant super-blocks


def _weight(name, rows, seed):
    w = random_weight(gguf.GGMLQuantizationType[name], rows, COLS, np.random.default_rng(seed))
    w.flags.writeable = False
    return w


def _products(qtype, w, X, chunks):
    qtypes, ws = quant_dot.stack([qtype], [w])
    Y = np.full((X.shape[0], w.shape[0]), np.nan, np.float32)
    quant_dot.products(formats_of(list(qtypes)), qtypes, ws, X, Y, chunks)
    return Y


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("m", [5, 8, 17, k_quant_lanes.MIN_INPUT_ROWS + 1])
def test_rows_in_lanes_equal_each_row_alone(name, m):
    qtype = FORMATS[name]
    w = _weight(name, 16 * 7 + 5, seed=m)  # 7 groups of 16 and 5 rows for the row kernels
    X = (np.random.default_rng(m).normal(size=(m, COLS)) * np.linspace(0.1, 9, COLS)).astype(np.float32)
    alone = np.concatenate([_products(qtype, w, X[i : i + 1], 1) for i in range(m)])
    np.testing.assert_array_equal(_products(qtype, w, X, 1), alone)
    np.testing.assert_array_equal(_products(qtype, w, X, 2), alone)


@pytest.mark.skipif(not row_lanes.AVAILABLE, reason="the lanes need AVX-512 VNNI")
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_the_lanes_kernel_itself_matches_the_row_kernel(name):
    """Called directly, so the lanes run whatever the product's dispatch decides."""
    qtype = FORMATS[name]
    w = _weight(name, 16 * 3 + 7, seed=1)  # the last group of 16 short of 9 rows
    X = (np.random.default_rng(2).normal(size=(3, COLS)) * np.linspace(0.1, 9, COLS)).astype(np.float32)
    act = quant_dot.activations(X, quant_dot.needs(np.array([qtype])))
    if qtype in row_lanes.FORMATS:  # the sums of four the activations leave out below the lanes' row count
        act = act._replace(xs4=act.xq.astype(np.int32).reshape(3, -1, 4).sum(axis=2).astype(np.int32))
    Y = np.full((3, w.shape[0] + 1), np.nan, np.float32)  # a column past the weight's rows, never written
    _lanes(qtype)(w, act, Y[:, :-1])
    assert np.isnan(Y[:, -1]).all()
    Y = Y[:, :-1]
    alone = np.concatenate([_products(qtype, w, X[i : i + 1], 1) for i in range(3)])
    np.testing.assert_array_equal(Y, alone)


_compiled = {}


def _lanes(qtype):
    """The format's lanes products as a function of its own (they are written to be inlined)."""
    if qtype not in _compiled:
        lanes = (row_lanes if qtype in row_lanes.FORMATS else k_quant_lanes).products_of(qtype)
        _compiled[qtype] = njit(lambda w, act, Y: lanes(w, act, Y))
    return _compiled[qtype]
