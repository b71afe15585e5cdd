"""The wgpu backend, "gpu" to users: WGSL compute shaders through wgpu (Metal on macOS, Vulkan on Linux and Windows)."""
