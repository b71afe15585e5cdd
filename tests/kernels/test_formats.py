"""Kernels compiled per set of weight formats (kernels.common.formats), and products compiled once per set."""

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from numba import njit

from kernels.common import formats
from kernels.cpu import quant
from kernels.cpu import quant_dot as dot
from tests.quant_weights import random_weight


@njit
def _double(x):
    return 2 * x


@njit
def _negate(x):
    return -x


_pick = formats.switch({1: _double, 2: _negate}, ("x",))


@njit
def _apply(fs, qtypes, x):
    return [_pick(fs, q, x) for q in qtypes]


def test_switch_runs_the_kernel_of_each_type_in_the_set():
    assert _apply(formats.of([2, 1]), np.array([1, 2, 1]), 3) == [6, -3, 6]


def test_the_code_of_a_type_outside_the_set_is_left_out():
    """Compiled for type 1 alone, the kernel of type 2 is not there: 1's runs, whatever the id."""
    assert _apply(formats.of([1]), np.array([1, 2]), 3) == [6, 6]


def test_a_set_with_a_type_the_switch_has_no_kernel_for_does_not_compile():
    with pytest.raises(TypeError, match=r"no kernel for GGML type ids \[7\]"):
        _apply(formats.of([1, 7]), np.array([1]), 3)


def test_sets_are_equal_whatever_the_order_and_repeats():
    assert formats.of([T.Q4_K, T.Q6_K, T.Q4_K]) is formats.of([T.Q6_K, T.Q4_K])


def test_stacks_of_one_to_three_weights_share_one_compiled_product():
    """The row-wise forward stacks q, k, v (3), gate and up (2), the output or down weight (1): every count
    runs the same compiled product of a format set, instead of one compilation per count."""
    rng = np.random.default_rng(0)
    qtype = int(T.Q5_1)
    ws = [quant.kernel_weight(qtype, random_weight(qtype, 32, 64, rng)) for _ in range(3)]
    X = rng.standard_normal((2, 64)).astype(np.float32)
    for n in (1, 2, 3):
        Y = np.empty((2, 32 * n), np.float32)
        dot.products(formats.of([qtype]), *dot.stack([qtype] * n, ws[:n]), X, Y, 1)
        for i in range(n):  # each weight's columns hold its own product
            np.testing.assert_array_equal(Y[:, 32 * i : 32 * (i + 1)], quant.rows(qtype, ws[i], X))
    compiled = [sig for sig in dot.products.signatures if sig[0].qtypes == (qtype,) and sig[0].lanes]
    assert len(compiled) == 1


def test_a_stack_takes_one_to_three_weights_with_a_type_each():
    w = np.zeros((32, 18), np.uint8)
    with pytest.raises(ValueError, match="1 to 3 weights"):
        dot.stack([int(T.Q4_0)] * 4, [w] * 4)
    with pytest.raises(ValueError, match="1 to 3 weights"):
        dot.stack([int(T.Q4_0)], [w, w])
