import pytest


@pytest.fixture(scope="session")
def gpu():
    """The wgpu device; the GPU tests skip only where no adapter exists (CI provides a software Vulkan one)."""
    from kernels.gpu.device import GpuUnavailable, gpu as start

    try:
        return start()
    except GpuUnavailable as e:
        pytest.skip(str(e))
