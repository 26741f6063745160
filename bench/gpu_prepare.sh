#!/usr/bin/env bash
# Fill bench/gpu_bundle/ (ignored by git) with what bench/gpu_check.sh needs on a GPU machine
# that has torch and a driver but no network: SPDL's wheels for CPython 3.12, FFmpeg 6.1's
# shared libraries inside PyAV's wheel (SPDL 0.8 binds FFmpeg 4 to 9), the real photos, and
# EfficientNet-Lite0's ImageNet weights in float16 (timm and torchvision are on that machine).
# Run here, after `make test` set up .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PYVER=${PYVER:-3.12}  # the GPU machine's Python; tests use this machine's
OUT=${BUNDLE:-bench/gpu_bundle}
LIMIT_MB=60

rm -rf "$OUT"
mkdir -p "$OUT/wheels"
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    "${platforms[@]}" -d "$OUT/wheels" spdl==0.8.0 spdl-io==0.8.0 spdl-core==0.8.0 av==12.3.0
"$PY" scripts/make_demo_data.py "$OUT/photos" >/dev/null
"$PY" scripts/convert_efficientnet_lite0.py --half "$OUT/efficientnet_lite0.pth" >/dev/null

size=$(du -sb "$OUT" | cut -f1)
echo "$OUT: $((size / 1000000)) MB"
if [ "$size" -ge $((LIMIT_MB * 1000000)) ]; then
    echo "error: the bundle is over ${LIMIT_MB} MB" >&2
    exit 1
fi
