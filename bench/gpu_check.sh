#!/usr/bin/env bash
# One prepared command for a machine with one NVIDIA GPU, its driver, Python with torch, and no
# network: installs the bundle from bench/gpu_prepare.sh into a scratch folder, puts FFmpeg's
# libraries on LD_LIBRARY_PATH, and runs bench/gpu_check.py within 8 minutes. Writes
# gpu_check.json and gpu_check.log to $OUT (or bench/gpu_out).
#   bench/gpu_check.sh [extra gpu_check.py flags, e.g. --device cpu --decoders ffmpeg]
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${BUNDLE:-bench/gpu_bundle}
OUT=${OUT:-bench/gpu_out}
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/gpu_check_site}
mkdir -p "$OUT" "$SITE/ffmpeg"

[ -d "$BUNDLE/wheels" ] || { echo "error: no $BUNDLE: run bench/gpu_prepare.sh first" >&2; exit 2; }
"$PY" -c "import torch, timm" || { echo "error: $PY lacks torch or timm" >&2; exit 2; }
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$BUNDLE"/wheels/spdl*.whl || exit 2
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

# FFmpeg: the shared libraries inside PyAV's wheel, under the sonames SPDL asks for.
"$PY" - "$BUNDLE" "$SITE/ffmpeg" <<'EOF' || exit 2
import pathlib, re, sys, zipfile
bundle, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
with zipfile.ZipFile(next((bundle / "wheels").glob("av-*.whl"))) as wheel:
    for name in wheel.namelist():
        if name.startswith("av.libs/"):
            target = dest / pathlib.Path(name).name
            target.write_bytes(wheel.read(name))
            if m := re.match(r"(lib(?:av\w+|sw\w+|postproc))-[0-9a-f]+\.so\.(\d+)", target.name):
                link = dest / f"{m[1]}.so.{m[2]}"
                link.unlink(missing_ok=True)
                link.symlink_to(target.name)
EOF
export LD_LIBRARY_PATH="$SITE/ffmpeg${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || echo "no nvidia-smi"
    "$PY" -c "import torch, spdl.io.utils as u; print('torch', torch.__version__, 'cuda', torch.cuda.is_available()); print('ffmpeg', u.get_ffmpeg_versions(), 'nvjpeg', u.built_with_nvjpeg(), 'nvcodec', u.built_with_nvcodec())"
} 2>&1 | tee "$OUT/environment.txt"
timeout 480 "$PY" bench/gpu_check.py --bundle "$BUNDLE" --out "$OUT" "$@"
