#!/bin/sh
# Build the one-folder bundle (packaging/fucina.spec), then smoke-test it: render the window offscreen with
# `--screenshot`, report the bundle's size and its cold start (first launch, empty kernel cache) and its
# warm start. Heavy (minutes, ~1 GB of disk while building): a CI job of its own, not the test suite:
#   pip install -e '.[bundle]' && packaging/build_bundle.sh
# Needs a downloaded default model for the screenshot to show a loaded model (it works without one).
set -eu
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=build/bundle
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
echo "bundle OK"
