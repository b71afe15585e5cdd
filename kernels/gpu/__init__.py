"""GPU kernels: WGSL compute shaders through wgpu (Metal on macOS, Vulkan on Linux and Windows)."""
