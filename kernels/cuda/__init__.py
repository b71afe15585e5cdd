"""CUDA kernels (numba-cuda, the optional `cuda` extra): the ops of kernels.backend on an NVIDIA GPU.

Weights stay in their GGUF block format in device memory and are decoded in the kernels (formats.py);
activations and the KV cache (f16 or q8_0) live on the device, so a token costs its id going in and its logits
coming out. Tested under numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1).
"""
