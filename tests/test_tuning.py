"""Finding the best settings: the sweep over loader settings, the run's timeline and its plot."""

from __future__ import annotations

import subprocess
import sys

import pytest
from PIL import Image

from imagenet_classification import parse_sweep
from tests.conftest import ROOT, TINY, read_json, run_cli

FAST = [*TINY, "--no-compile", "--dtype", "float32"]


def test_sweep_specs():
    defaults = {"num-threads": 16, "batch-size": 32, "queue-size": 16}
    assert parse_sweep(["auto"], defaults, 12)["num-threads"] == [1, 2, 4, 8, 12]
    assert parse_sweep(["auto"], defaults, 16)["num-threads"] == [1, 2, 4, 8, 16]
    grid = parse_sweep(["num-threads=4,1,2", "batch-size=64"], defaults, 2)
    assert grid == {"num-threads": [1, 2, 4], "batch-size": [64], "queue-size": [16]}
    for bad in ("threads=1", "num-threads=", "num-threads=0,1", "batch-size=x", "auto=1"):
        with pytest.raises(ValueError):
            parse_sweep([bad], defaults, 2)


def test_sweep_on_real_photos_writes_table_json_and_plot(demo_photos, tmp_path):
    out, plot = tmp_path / "sweep.json", tmp_path / "sweep.png"
    proc = run_cli("--input-flist", demo_photos, "--prefix", f"{demo_photos.parent}/", *FAST, "--sweep",
                   "num-threads=1,2", "batch-size=4,8", "--results-file", out, "--plot", plot)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sweep = read_json(out)["sweep"]
    points = sweep["points"]
    assert [(p["num_threads"], p["batch_size"]) for p in points] == [(1, 4), (1, 8), (2, 4), (2, 8)]
    assert sweep["images_per_setting"] == 20  # every setting timed on the same images
    assert all(p["loader_fps"] > 0 and p["model_fps"] > 0 for p in points)
    bound = max(min(p["loader_fps"], p["model_fps"]) for p in points)
    key = ("num_threads", "batch_size", "queue_size")
    candidates = sorted((p for p in points if min(p["loader_fps"], p["model_fps"]) >= 0.95 * bound),
                        key=lambda p: [p[k] for k in key])  # fmt: skip
    measured = [p for p in points if p["e2e_fps"] is not None]
    assert 1 <= len(measured) <= 3 and all(p["e2e_fps"] > 0 for p in measured)
    assert all(p in candidates for p in measured)  # only candidates are run end to end
    best = sweep["recommended"]
    top = max(p["e2e_fps"] for p in measured)
    assert best in measured and best["e2e_fps"] >= 0.95 * top
    assert all(p["e2e_fps"] < 0.95 * top for p in measured if [p[k] for k in key] < [best[k] for k in key])
    assert "threads  batch  queue    loader     model  end-to-end" in proc.stdout
    flags = f"--num-threads {best['num_threads']} --batch-size {best['batch_size']} --queue-size 16"
    assert f"The smallest setting within 5% of the best: {flags}" in proc.stdout
    command = proc.stdout.strip().splitlines()[-1].split()
    assert command[0] == "imagenet_classification.py" and "--sweep" not in command and " ".join(command).endswith(flags)
    with Image.open(plot) as image:
        assert image.format == "PNG" and image.size[0] > 400


def test_sweep_without_matplotlib_still_prints_the_table(jpeg_set, tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None; sys.argv = ['imagenet_classification.py', *sys.argv[1:]];"
            " import runpy; runpy.run_path(sys.argv[0], run_name='__main__')")  # fmt: skip
    args = ["--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *FAST, "--sweep", "num-threads=1",
            "--batch-size", "8", "--plot", tmp_path / "s.png"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "The smallest setting within 5% of the best" in proc.stdout
    assert "pip install 'imagenet-classification[plot]'" in proc.stderr and not (tmp_path / "s.png").exists()


def test_timeline_sums_to_the_images_and_is_drawn(jpeg_set, tmp_path):
    out, plot = tmp_path / "r.json", tmp_path / "t.png"
    proc = run_cli("--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *FAST, "--batch-size", "4",
                   "--warmup-batches", "2", "--results-file", out, "--plot", plot)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = read_json(out)
    t = result["timeline"]
    assert sum(t["images"]) == sum(t["batch_images"]) == result["classified"] == 30
    assert len(t["batch_end_s"]) == result["batches"] == 8
    assert sorted(t["batch_end_s"]) == t["batch_end_s"] and t["batch_end_s"][-1] <= t["end_s"]
    timed = sum(n for end, n in zip(t["batch_end_s"], t["batch_images"], strict=True) if end > t["warmup_end_s"])
    assert timed == result["frames_timed"] == 22
    assert t["images_per_s"] == [n / t["interval_s"] for n in t["images"]]
    assert len(t["sink_occupancy"]) == len(t["images"]) and all(0 <= v <= 1 for v in t["sink_occupancy"])
    assert result["elapsed_s"] == pytest.approx(t["end_s"] - t["warmup_end_s"], abs=0.05)
    with Image.open(plot) as image:
        assert image.format == "PNG"
