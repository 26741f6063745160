"""The GPU check kit, everything of it that runs without a GPU: preparation, packaging, the CPU legs.

bench/gpu_prepare.sh downloads from PyPI, as it does when a developer runs it.
"""

import json
import os
import subprocess
import sys

from tests.conftest import ROOT


def test_prepare_then_check_on_the_cpu(tmp_path):
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    env = {**os.environ, "BUNDLE": str(tmp_path / "bundle"), "PYVER": python, "PY": sys.executable,
           "OUT": str(tmp_path / "out"), "SITE": str(tmp_path / "site"), "PYTHON": sys.executable}  # fmt: skip
    prepare = subprocess.run(["bash", str(ROOT / "bench" / "gpu_prepare.sh")], env=env, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
    assert prepare.returncode == 0, prepare.stderr
    size = sum(f.stat().st_size for f in (tmp_path / "bundle").rglob("*") if f.is_file())
    assert size < 60_000_000

    check = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), "--device", "cpu", "--decoders", "ffmpeg,nvjpeg",
         "--images", "40", "--batch-size", "8", "--threads", "2", "--no-compile"],
        env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    # SPDL ran on FFmpeg 6.1 from PyAV's wheel in the bundle, not this machine's FFmpeg 5.1.
    assert "'libavcodec': (60," in (tmp_path / "out" / "environment.txt").read_text()
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    ffmpeg, nvjpeg = report["legs"]["ffmpeg"], report["legs"]["nvjpeg"]
    assert ffmpeg["ok"] and ffmpeg["result"]["classified"] == 40 and "breakdown" in ffmpeg["result"]
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
         "--images", "40", "--no-compile", "--time-budget", "65"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert short.returncode == 0, short.stderr
    report = json.loads((tmp_path / "out2" / "gpu_check.json").read_text())
    assert report["legs"]["ffmpeg"] == {"ok": False, "error": "not run: the time budget was spent"}
    assert report["agreement"]["photos"] == 40 and "torch" in report["env"]
