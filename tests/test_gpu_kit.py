"""The GPU check kit, everything of it that runs without a GPU: preparation, packaging, the CPU legs.

bench/gpu_prepare.sh downloads from PyPI, as it does when a developer runs it.
"""

import json
import os
import subprocess
import sys
import zipfile

from tests.conftest import ROOT


def test_prepare_then_check_on_the_cpu(tmp_path):
    # The bundle holds SPDL for several Pythons: this one and another, as the GPU machine may have.
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    env = {**os.environ, "BUNDLE": str(tmp_path / "bundle"), "PYVERS": f"{python} 3.13", "PY": sys.executable,
           "OUT": str(tmp_path / "out"), "SITE": str(tmp_path / "site"), "PYTHON": sys.executable}  # fmt: skip
    prepare = subprocess.run(["bash", str(ROOT / "bench" / "gpu_prepare.sh")], env=env, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
    assert prepare.returncode == 0, prepare.stderr
    size = sum(f.stat().st_size for f in (tmp_path / "bundle").rglob("*") if f.is_file())
    assert size < 60_000_000

    check = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), "--device", "cpu", "--decoders", "ffmpeg,nvjpeg",
         "--images", "40", "--repeat", "2", "--batch-size", "8", "--threads", "2", "--no-compile",
         "--layouts", "2x1", "--scratch", tmp_path / "scratch"],
        env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    # SPDL ran on FFmpeg 6.1 from PyAV's wheel in the bundle, not this machine's FFmpeg 5.1.
    assert "'libavcodec': (60," in (tmp_path / "out" / "environment.txt").read_text()
    names = zipfile.ZipFile(tmp_path / "bundle" / "spdl-site.zip").namelist()
    assert {
        f"spdl/io/lib/_spdl_ffmpeg6.cpython-{v}-x86_64-linux-gnu.so" for v in (python.replace(".", ""), "313")
    } <= set(names) and not any("ffmpeg5" in name for name in names)
    # nvImageCodec for the same Pythons and its JPEG codecs only; nvJPEG's library, unpacked where
    # it looks, since this machine has none.
    names = set(zipfile.ZipFile(tmp_path / "bundle" / "nvimgcodec-site.zip").namelist())
    modules = {name for name in names if "nvimgcodec_impl" in name}
    assert modules == {f"nvidia/nvimgcodec/nvimgcodec_impl.cpython-{v}-x86_64-linux-gnu.so"
                       for v in (python.replace(".", ""), "313")}  # fmt: skip
    assert {name.split("/")[-1].split(".")[0] for name in names if "/extensions/" in name} == {
        "libnvjpeg_ext", "libjpeg_turbo_ext"}  # fmt: skip
    assert (tmp_path / "site" / "nvidia" / "cu13" / "lib" / "libnvjpeg.so.13").exists()
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    machine = report["machine"]  # written first, before the check
    assert machine["python"].startswith(python) and "libcuda.so.1" in machine["libraries"]
    assert "cannot open shared object" in machine["spdl_cuda"] and machine["nvidia_smi"]
    assert machine["nvimgcodec"].startswith("0.9") and machine["nvjpeg"].startswith("the bundle's")
    # Decode-only rates with nvImageCodec's CPU decoder and torchvision's, and the resize grouped
    # by size against one by one, on one batch (the GPU's backends and engines are GPU steps).
    rates = report["nvjpeg_rates"]
    assert rates["batch"] == 8 and rates["jpeg_engines"] is None
    assert rates["nvimgcodec_cpu"]["decoded"] == 8 and rates["nvimgcodec_cpu"]["fps"] > 0
    assert rates["torchvision"]["fps"] > 0 and rates["resize"]["sizes"] >= 1
    assert rates["resize"]["grouped_fps"] > 0 and rates["resize"]["per_image_fps"] > 0
    ffmpeg, nvjpeg = report["legs"]["ffmpeg"], report["legs"]["nvjpeg"]
    # Each leg lists the 40 images twice; the images stay in the scratch folder, out of OUT.
    assert ffmpeg["ok"] and ffmpeg["result"]["classified"] == 80 and "breakdown" in ffmpeg["result"]
    assert ffmpeg["result"]["config"]["compile"] is False and ffmpeg["result"]["loader_lead"] <= 16 + 3 + 2
    # FFmpeg again in 2 worker processes of 1 thread (--decode-processes): the same images, its CPU time kept.
    layout = report["legs"]["ffmpeg-2x1"]
    assert layout["ok"] and layout["result"]["classified"] == 80 and layout["result"]["config"]["decode_processes"] == 2
    assert all(leg["cpu_s"] > 0 and leg["cpu_over_wall"] > 0 for leg in (ffmpeg, layout))
    assert not (tmp_path / "out" / "images").exists() and (tmp_path / "scratch" / "images" / "val40.flist").exists()
    rates = report["decode_rates"]
    assert rates["one_core_fps"] > 0 and rates["target_loader_fps"] == 0.75 * rates["cores"] * rates["one_core_fps"]
    assert "nccl_one_rank" not in report and "nvdec_planes" not in report  # GPU steps only
    assert not nvjpeg["ok"] and "--use-nvjpeg decodes on a CUDA GPU" in nvjpeg["error"]
    assert report["agreement"]["photos"] == 40 and report["agreement"]["nvjpeg"]["ok"] is False
    # Unusual images through the bundle's FFmpeg 6.1: each decodes (FFmpeg against itself: identical).
    unusual = report["unusual_images"]
    assert unusual["images"] == 10 and unusual["ffmpeg"]["ok"] and not unusual["ffmpeg"]["failed"]
    assert len(unusual["ffmpeg"]["mad"]) == 10 and unusual["ffmpeg"]["max_mad"] == 0
    assert not unusual["nvjpeg"]["ok"] and "nvjpeg decodes on a CUDA GPU" in unusual["nvjpeg"]["error"]
    assert (tmp_path / "out" / "gpu_check.log").stat().st_size > 0

    # A budget too small for any leg: the legs say so, the photo agreement still runs, the JSON is written.
    env["OUT"] = str(tmp_path / "out2")
    short = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), "--device", "cpu", "--decoders", "ffmpeg",
         "--images", "40", "--no-compile", "--time-budget", "65", "--scratch", tmp_path / "scratch"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert short.returncode == 0, short.stderr
    report = json.loads((tmp_path / "out2" / "gpu_check.json").read_text())
    assert report["legs"]["ffmpeg"] == {"ok": False, "error": "not run: the time budget was spent"}
    assert report["agreement"]["photos"] == 40 and "torch" in report["env"]
    assert report["nvjpeg_rates"]["nvimgcodec_cpu"]["fps"] > 0  # before the legs, within the budget

    # The engine count through nvJPEG's C API, with the bundle's library: no hardware decoder here.
    code = "import gpu_check, json; print(json.dumps(gpu_check.jpeg_engines()))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "bench", capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}, timeout=60)  # fmt: skip
    engines = json.loads(proc.stdout.strip().splitlines()[-1])
    assert engines["library"].endswith("nvidia/cu13/lib/libnvjpeg.so.13") and engines["engines"] == 0
    assert "nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE) returned" in engines["error"]


def test_the_torchrun_path_on_one_rank(tmp_path):
    # gpu_check's one-rank step, on the CPU: Gloo's process group, the exact sums, the per-rank
    # rows and the teardown (on a GPU the same code runs NCCL). A process of its own: it joins a group.
    code = "import sys; sys.argv = ['x']; import gpu_check, json; print(json.dumps(gpu_check.nccl_one_rank('cpu')))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "bench", capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"] and out["backend"] == "gloo" and out["ranks"][0]["classified"] == 9
    assert (out["total"]["top5_correct"], out["total"]["fps"]) == (8, 16.0)
    assert out["total"]["decoder_backends"] == {"hardware": 8, "hybrid": 1}
