#!/bin/sh
# Build the one-folder bundle (packaging/fucina.spec) with the CPU kernels compiled in, then smoke-test it:
# render the window offscreen with `--screenshot`, report the bundle's size and its cold start (first launch,
# empty kernel cache) and its warm start, measure a first reply on an empty kernel cache, and reply on the
# GPU backend. Heavy (minutes, ~1 GB of disk while building), so not part of
# the test suite; .ci/run runs it after the tests:
#   pip install -e '.[bundle]' && packaging/build_bundle.sh
# Needs a downloaded default model for the screenshot to show a loaded model (it works without one).
set -eu
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=build/bundle
# The CPU kernels go in compiled for the x86-64 targets this machine runs (engine/platform/kernel_build.py)
"$PYTHON" -m engine.platform.kernel_build
"$PYTHON" -m PyInstaller --noconfirm --log-level WARN --distpath "$OUT/dist" --workpath "$OUT/work" packaging/fucina.spec
APP="$OUT/dist/fucina/fucina"
echo "bundle: $(du -sh "$OUT/dist/fucina" | cut -f1) in $OUT/dist/fucina"
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
for run in cold warm; do
    start=$(date +%s.%N)
    QT_QPA_PLATFORM=offscreen NUMBA_CACHE_DIR="$SCRATCH/numba" "$APP" --screenshot "$SCRATCH/$run.png"
    end=$(date +%s.%N)
    test -s "$SCRATCH/$run.png"
    echo "$run start to screenshot: $(echo "$end - $start" | bc) s"
done
"$APP" models list > /dev/null
# A first reply on an empty kernel cache, from launch: with the shipped kernels (on a CPU they were built
# for, nothing compiles) and compiled for this CPU instead (needs the starter downloaded, as the tests do)
if "$APP" models list | grep -q "smollm2-135m-instruct.*downloaded"; then
    MODEL=$("$APP" models path smollm2-135m-instruct)
    for kernels in shipped host; do
        target=$([ "$kernels" = host ] && echo host || true)
        start=$(date +%s.%N)
        FUCINA_KERNEL_TARGET="$target" NUMBA_CACHE_DIR="$SCRATCH/numba-$kernels" "$APP" generate "$MODEL" \
            --prompt "Hello" --max-tokens 1 > /dev/null
        end=$(date +%s.%N)
        echo "first token from launch on an empty kernel cache, $kernels kernels: $(echo "$end - $start" | bc) s"
    done
fi
# The GPU backend is bundled: a tiny model (the warm-up's writer, Q8_0 weights) replies with --backend gpu.
# Without a GPU, or a software Vulkan driver, the CPU replies after one warning; a bundle without wgpu would
# say that the backend needs the package.
"$PYTHON" -c "import sys; from pathlib import Path; from engine.platform.warmup import write_model
write_model(Path(sys.argv[1]), {'arch': 'llama', 'types': {'*': 'Q8_0'}})" "$SCRATCH/tiny.gguf"
NUMBA_CACHE_DIR="$SCRATCH/numba" "$APP" generate "$SCRATCH/tiny.gguf" --prompt-ids 1,2,3 --max-tokens 2 \
    --backend gpu > /dev/null 2> "$SCRATCH/gpu.log" || { cat "$SCRATCH/gpu.log" >&2; exit 1; }
if grep -q "wgpu package\|not installed" "$SCRATCH/gpu.log"; then
    cat "$SCRATCH/gpu.log" >&2
    echo "the bundle lacks the GPU backend" >&2
    exit 1
elif grep -q "^warning:" "$SCRATCH/gpu.log"; then
    echo "GPU backend: bundled; no GPU here, the CPU replied ($(grep -m1 '^warning:' "$SCRATCH/gpu.log"))"
else
    echo "GPU backend: a reply ran on the GPU"
fi
echo "bundle OK"
