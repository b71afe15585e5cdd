"""Backends for the tests of what a model needs: the CPU's, less one op."""

from kernels.cpu.backend import CpuBackend


def cpu_without(op: str, name: str) -> CpuBackend:
    """The CPU backend, named `name`, saying it does not run `op` (a device that lacks it)."""

    class Without(CpuBackend):
        def supports_op(self, asked: str) -> bool:
            return asked != op and super().supports_op(asked)

    backend = Without()
    backend.name = name
    return backend
