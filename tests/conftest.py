"""Shared pytest fixtures. Keep each block short; add new fixtures below the existing ones."""

import pytest


@pytest.fixture(scope="session")
def model_path():
    """Factory: `model_path(name)` -> Path of a starter model, pulled on first use.

    Pulls go to the user's models directory (not a temp dir) so later runs and CI re-runs reuse them.
    """
    from engine.platform.catalog import models_dir, pull

    directory = models_dir()  # fixed now, so a test that sets FUCINA_HOME never re-downloads a model
    return lambda name: pull(name, directory=directory)


@pytest.fixture(scope="session")
def gpu():
    """The wgpu device; GPU tests skip only where no adapter exists (CI provides a software Vulkan one)."""
    from kernels.wgpu.device import GpuUnavailable, gpu as start

    try:
        return start()
    except GpuUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session", autouse=True)
def one_row_wise_kernel_variant():
    """Every row-wise forward runs the verify kernels, compiled at the first call: one compilation per
    format set instead of two (the split of decode's and verify's is tests/kernels/test_row_variants.py's)."""
    from kernels.cpu import row_variants

    row_variants.SEPARATE_DECODE = False
    yield
    row_variants.SEPARATE_DECODE = True


@pytest.fixture
def separate_decode_kernels(monkeypatch):
    """The row-wise forward as outside the tests: decode's kernels for one row, verify's compiled apart."""
    from kernels.cpu import row_variants

    monkeypatch.setattr(row_variants, "SEPARATE_DECODE", True)
