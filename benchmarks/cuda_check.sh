#!/bin/sh
# The CUDA backend's check on a machine with an NVIDIA GPU (issue 18), run from the repository root:
#   sh benchmarks/cuda_check.sh [PYTHON]
# 1. the device starts (this fails loudly rather than falling back to the CPU);
# 2. the fidelity bars of the three starter models through --backend cuda, f16 and q8_0 caches
#    (tests/engine/test_fidelity.py);
# 3. prefill and decode tok/s of Qwen2.5-0.5B on CUDA beside the CPU backend (fucina bench).
set -eu
PY=${1:-python}
$PY -m pip install -q "numba-cuda>=0.30"
$PY -c "from kernels.cuda.backend import create_backend; create_backend(); print('cuda backend started')"
FUCINA_TEST_BACKEND=cuda $PY -m pytest -q -s tests/engine/test_fidelity.py -k "cache_"
for backend in cuda cpu; do
    $PY -m app.cli bench qwen2.5-coder-0.5b-instruct --backend "$backend" --prompt-tokens 512 --gen-tokens 64 \
        --runs 2 --json
done
