#!/usr/bin/env bash
# One prepared command for a machine with one NVIDIA GPU, its driver, Python 3.10-3.13 with
# torch, and no network: unpacks the bundle from bench/gpu_prepare.sh into a scratch folder (SPDL,
# nvImageCodec, and nvJPEG's library if the machine has no libnvjpeg.so.13), puts FFmpeg's
# libraries (and an unversioned libnvcuvid.so, which SPDL's CUDA extension needs) on
# LD_LIBRARY_PATH, writes what it found into gpu_check.json first, and runs bench/gpu_check.py
# within 8 minutes. Writes gpu_check.json and gpu_check.log to $OUT (or bench/gpu_out).
#   bench/gpu_check.sh [extra gpu_check.py flags, e.g. --device cpu --decoders ffmpeg]
# Environment: BUNDLE (default bench/gpu_bundle), OUT (default bench/gpu_out), PYTHON (default
# python3), SITE (the scratch folder, default /tmp/gpu_check_site); these folders are read from
# where it is started, gpu_check.py's own (--scratch) from the repository's folder.
set -uo pipefail
here=$(dirname "$0")
for arg in "$@"; do
    if [ "$arg" = --help ] || [ "$arg" = -h ]; then
        sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"
        echo
        echo "gpu_check.py's flags (--bundle and --out come from BUNDLE and OUT):"
        exec "${PYTHON:-python3}" "$here/gpu_check.py" --help
    fi
done
# The folders as given, against the caller's folder (the script then works from the repository's).
BUNDLE=$(realpath -m -- "${BUNDLE:-$here/gpu_bundle}")
OUT=$(realpath -m -- "${OUT:-$here/gpu_out}")
SITE=$(realpath -m -- "${SITE:-/tmp/gpu_check_site}")
PY=${PYTHON:-python3}
cd "$here/.."
if [ ! -f "$BUNDLE/spdl-site.zip" ]; then
    echo "error: BUNDLE $BUNDLE: no spdl-site.zip in it: run bench/gpu_prepare.sh first" >&2
    exit 2
fi
mkdir -p "$OUT" "$SITE/ffmpeg" "$SITE/links" || exit 2

"$PY" -m zipfile -e "$BUNDLE/spdl-site.zip" "$SITE" || exit 2
"$PY" -m zipfile -e "$BUNDLE/nvimgcodec-site.zip" "$SITE" || exit 2
# nvImageCodec's nvJPEG extension finds libnvjpeg.so.13 on the library path, or beside itself in
# nvidia/cu13/lib (its RPATH): the bundle's copy goes there only if the machine has none.
"$PY" - "$BUNDLE" "$SITE" <<'EOF' || exit 2
import ctypes, pathlib, sys, zipfile
bundle, site = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
try:
    ctypes.CDLL("libnvjpeg.so.13")
except OSError:
    with zipfile.ZipFile(next((bundle / "wheels").glob("nvidia_nvjpeg-*.whl"))) as wheel:
        wheel.extract("nvidia/cu13/lib/libnvjpeg.so.13", site)
EOF
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

# FFmpeg: the shared libraries inside PyAV's wheel, under the sonames SPDL asks for.
"$PY" - "$BUNDLE" "$SITE/ffmpeg" <<'EOF' || exit 2
import pathlib, re, sys, zipfile
bundle, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
with zipfile.ZipFile(next((bundle / "wheels").glob("av-*.whl"))) as wheel:
    for name in wheel.namelist():
        if name.startswith("av.libs/") and not name.endswith("/"):
            target = dest / pathlib.Path(name).name
            target.write_bytes(wheel.read(name))
            if m := re.match(r"(lib(?:av\w+|sw\w+|postproc))-[0-9a-f]+\.so\.(\d+)", target.name):
                link = dest / f"{m[1]}.so.{m[2]}"
                link.unlink(missing_ok=True)
                link.symlink_to(target.name)
EOF
# SPDL's CUDA extension needs libnvcuvid.so, unversioned; drivers (in containers especially) often
# ship only libnvcuvid.so.1. A link on LD_LIBRARY_PATH, set before Python starts, is what works.
nvcuvid=$(ldconfig -p 2>/dev/null | awk '/libnvcuvid\.so\.1 /{print $NF; exit}')
[ -n "$nvcuvid" ] && ln -sf "$nvcuvid" "$SITE/links/libnvcuvid.so"
export LD_LIBRARY_PATH="$SITE/ffmpeg:$SITE/links${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# What this machine has, into gpu_check.json before anything can fail.
"$PY" - "$OUT" "$SITE" <<'EOF'
import ctypes, json, pathlib, platform, shutil, subprocess, sys
env = {"python": platform.python_version(), "machine": platform.machine()}
if shutil.which("nvidia-smi"):
    query = "--query-gpu=name,driver_version,memory.total,compute_cap"
    smi = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True)
    env["nvidia_smi"] = (smi.stdout or smi.stderr).strip()
else:
    env["nvidia_smi"] = "not found"
env["libraries"] = {}
for name in ("libcuda.so.1", "libnvcuvid.so", "libnvcuvid.so.1", "libnvjpeg.so", "libnvjpeg.so.13", "libcudart.so.13"):
    try:
        ctypes.CDLL(name)
        env["libraries"][name] = "found"
    except OSError as e:
        env["libraries"][name] = str(e)
try:
    import torch
    env["torch"] = f"{torch.__version__} (CUDA {torch.version.cuda}, available: {torch.cuda.is_available()})"
except Exception as e:
    env["torch"] = f"cannot import: {e}"
try:
    import spdl.io.lib
    import spdl.io.utils
    env["spdl_ffmpeg"] = str(spdl.io.utils.get_ffmpeg_versions())
    spdl.io.lib._import_libspdl_cuda()
    env["spdl_cuda"] = "loads"
except Exception as e:
    env["spdl_cuda"] = f"{type(e).__name__}: {e}"
bundled = pathlib.Path(sys.argv[2]) / "nvidia/cu13/lib/libnvjpeg.so.13"
env["nvjpeg"] = "the bundle's (the machine has no libnvjpeg.so.13)" if bundled.exists() else "the machine's"
try:
    import nvidia.nvimgcodec
    env["nvimgcodec"] = f"{nvidia.nvimgcodec.__version__} (CUDA {nvidia.nvimgcodec.__cuda_version__})"
except Exception as e:
    env["nvimgcodec"] = f"{type(e).__name__}: {e}"
out = pathlib.Path(sys.argv[1])
(out / "gpu_check.json").write_text(json.dumps({"machine": env}, indent=2) + "\n")
(out / "environment.txt").write_text("\n".join(f"{k}: {v}" for k, v in env.items()) + "\n")
print(json.dumps(env, indent=2))
EOF
# torch.compile in every leg with all the CPUs, sharing one cache: the first leg fills it.
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-$(nproc)}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$SITE/inductor}
timeout 480 "$PY" bench/gpu_check.py --bundle "$BUNDLE" --out "$OUT" "$@"
