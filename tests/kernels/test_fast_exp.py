"""The vectorized float32 exp: float32 accuracy over its range, saturation outside it."""

import numpy as np
from numba import njit

from kernels.cpu.fast_exp import exp32


@njit
def _exp_all(x, out):
    for i in range(x.size):
        out[i] = exp32(x[i])


def test_exp32_matches_exp_to_float32_rounding():
    x = np.linspace(-87, 88, 400_001, dtype=np.float32)
    got = np.empty_like(x)
    _exp_all(x, got)
    ref = np.exp(x.astype(np.float64))
    assert np.max(np.abs(got - ref) / ref) < 3e-7


def test_exp32_saturates_instead_of_overflowing():
    x = np.array([-1e30, -200, 200, 1e30, np.inf, -np.inf], np.float32)
    got = np.empty_like(x)
    _exp_all(x, got)
    assert np.all(np.isfinite(got))
    assert np.all(got[:2] < 1e-37) and got[0] >= 0 and np.all(got[2:4] > 1e38)


def test_exp32_is_zero_below_the_normal_range_never_subnormal():
    """A peaked softmax leaves most weights far below e^-87: subnormal ones would slow every product after it."""
    x = np.linspace(-120, -80, 40_001, dtype=np.float32)
    got = np.empty_like(x)
    _exp_all(x, got)
    tiny = np.finfo(np.float32).tiny  # the smallest normal float32
    assert np.all((got == 0) | (got >= tiny))
    assert np.all(got[x < -87] == 0) and np.all(got[x >= -87] > 0)
