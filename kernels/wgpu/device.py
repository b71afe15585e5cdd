"""The wgpu device the GPU kernels run on: adapter, buffers, cached pipelines, queued dispatches.

wgpu maps to Metal on macOS and Vulkan elsewhere (a software Vulkan driver such as
Mesa's lavapipe works too, slowly). Dispatches are recorded into one command
encoder and submitted together when a result is read back, so a forward pass
costs one submission rather than one per kernel.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

SHADERS = Path(__file__).parent / "shaders"
WORKGROUP = 64  # threads per workgroup in every shader (WGSL's `const WG`)


class GpuUnavailable(RuntimeError):
    """No wgpu adapter could be started; the caller falls back to the CPU."""


class Gpu:
    """One wgpu device and what is cached on it."""

    def __init__(self):
        try:
            import wgpu
        except ImportError as e:
            raise GpuUnavailable(f"the GPU backend needs the wgpu package ({e}); install fucina[gpu]") from None
        self._wgpu = wgpu
        try:
            adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        except Exception as e:  # wgpu raises plain RuntimeErrors for missing drivers
            raise GpuUnavailable(f"no GPU adapter: {e}") from None
        if adapter is None:
            raise GpuUnavailable("no GPU adapter (no Metal or Vulkan driver found)")
        self.info = adapter.info
        limits = adapter.limits
        self.max_binding = int(limits["max-storage-buffer-binding-size"])
        self.device = adapter.request_device_sync(required_limits={
            "max-storage-buffer-binding-size": self.max_binding,
            "max-buffer-size": int(limits["max-buffer-size"]),
            "max-storage-buffers-per-shader-stage": min(8, int(limits["max-storage-buffers-per-shader-stage"])),
        })
        self._pipelines: dict[str, object] = {}
        self._uniforms: dict[bytes, object] = {}
        self._encoder = None

    @property
    def name(self) -> str:
        return f"{self.info['device']} ({self.info['backend_type']})"

    # -- buffers --------------------------------------------------------------------------------------

    def upload(self, data: np.ndarray):
        """A storage buffer holding data's bytes (padded to whole u32 words, which the shaders read)."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if raw.size % 4 or raw.size == 0:
            raw = np.concatenate([raw, np.zeros(4 - raw.size % 4, np.uint8)])
        usage = self._wgpu.BufferUsage
        return self.device.create_buffer_with_data(data=raw, usage=usage.STORAGE | usage.COPY_SRC | usage.COPY_DST)

    def empty(self, nbytes: int):
        usage = self._wgpu.BufferUsage
        return self.device.create_buffer(size=max(4, -(-nbytes // 4) * 4),
                                         usage=usage.STORAGE | usage.COPY_SRC | usage.COPY_DST)

    def write(self, buffer, data: np.ndarray, offset: int = 0) -> None:
        """data's bytes into buffer at offset, ordered after the dispatches queued so far."""
        self.flush()
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        self.device.queue.write_buffer(buffer, offset, raw)

    def read(self, buffer, dtype, shape, offset: int = 0) -> np.ndarray:
        """The buffer's contents as an array, after every queued dispatch has run."""
        self.flush()
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        size = -(-n // 4) * 4
        data = self.device.queue.read_buffer(buffer, offset, size)
        return np.frombuffer(data, np.uint8)[:n].view(dtype).reshape(shape).copy()

    def copy(self, src, src_offset: int, dst, dst_offset: int, nbytes: int) -> None:
        self._encoding().copy_buffer_to_buffer(src, src_offset, dst, dst_offset, nbytes)

    # -- kernels --------------------------------------------------------------------------------------

    def pipeline(self, name: str, source: str):
        """The compute pipeline of a WGSL source, compiled once per name."""
        p = self._pipelines.get(name)
        if p is None:
            module = self.device.create_shader_module(label=name, code=source)
            p = self._pipelines[name] = self.device.create_compute_pipeline(
                label=name, layout="auto", compute={"module": module, "entry_point": "main"})
        return p

    def dispatch(self, pipeline, params: np.ndarray, buffers, groups: tuple[int, int, int]) -> None:
        """Queue one dispatch: binding 0 the params (a uniform), bindings 1.. the buffers in order."""
        entries = [{"binding": 0, "resource": {"buffer": self._uniform(params)}}]
        entries += [{"binding": i + 1, "resource": {"buffer": b}} for i, b in enumerate(buffers)]
        group = self.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
        x, y, z = groups
        if x > 65535:  # one dimension's limit: fold the rest into y (shaders rebuild the flat index)
            raise ValueError(f"dispatch of {x} workgroups in x exceeds 65535")
        pass_ = self._encoding().begin_compute_pass()
        pass_.set_pipeline(pipeline)
        pass_.set_bind_group(0, group)
        pass_.dispatch_workgroups(x, y, z)
        pass_.end()

    def flush(self) -> None:
        """Submit the queued dispatches."""
        if self._encoder is not None:
            self.device.queue.submit([self._encoder.finish()])
            self._encoder = None

    def _encoding(self):
        if self._encoder is None:
            self._encoder = self.device.create_command_encoder()
        return self._encoder

    def _uniform(self, params: np.ndarray):
        """A uniform buffer per distinct parameter block (the same layer's op reuses its own)."""
        raw = np.ascontiguousarray(params).view(np.uint8).tobytes()
        raw += b"\0" * (-len(raw) % 16)
        buf = self._uniforms.get(raw)
        if buf is None:
            if len(self._uniforms) > 4096:  # positions make most blocks one-off: keep the cache bounded
                self._uniforms.clear()
            usage = self._wgpu.BufferUsage
            buf = self._uniforms[raw] = self.device.create_buffer_with_data(data=raw, usage=usage.UNIFORM)
        return buf


@functools.cache
def gpu() -> Gpu:
    """The process's GPU device, started on first use (GpuUnavailable when there is none)."""
    return Gpu()


def shader(name: str) -> str:
    return (SHADERS / f"{name}.wgsl").read_text()
