"""The command line, run as a user would: printed lines, results file, exit codes."""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from imagenet_classification import get_model, main
from tests.conftest import ROOT, TINY, read_json, run_cli, run_main

RESULT_KEYS = {
    "fps", "elapsed_s", "frames_timed", "listed", "classified", "failed", "not_reached",
    "top1_correct", "top5_correct", "top1", "top5", "partial", "config", "env", "batches_timed", "loader_lead",
    "fps_max_overstatement",
}  # fmt: skip
CONFIG_KEYS = {
    "model", "weights", "batch_size", "num_threads", "decoder", "device", "dtype", "compile",
    "input_size", "crop_pct", "interpolation", "mean", "std",
}  # fmt: skip


def _assert_accounted(result: dict) -> None:
    assert result["classified"] + result["failed"] + result["not_reached"] == result["listed"]


def test_full_run_prints_lines_and_writes_results(jpeg_set, tmp_path):
    out = tmp_path / "results.json"
    proc = run_cli("--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--no-compile",
                   "--no-bf16", "--batch-size", "4", "--warmup-batches", "2", "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^FPS=\d+\.\d\d \(22/\d+\.\d{2,}\)$", proc.stdout, re.M), proc.stdout  # 30 - 2 x 4 warm-up
    assert re.search(r"^Accuracy \(top1\)=\d+\.\d\d% \(\d+/30\)$", proc.stdout, re.M)
    assert re.search(r"^Accuracy \(top5\)=\d+\.\d\d% \(\d+/30\)$", proc.stdout, re.M)
    assert "Images: listed=30 classified=30 failed=0 not_reached=0" in proc.stdout
    assert "leaked" not in proc.stderr  # nanobind's warning about SPDL buffers alive at exit
    result = read_json(out)
    assert RESULT_KEYS <= result.keys() and CONFIG_KEYS <= result["config"].keys()
    assert (result["listed"], result["classified"], result["frames_timed"], result["batches"]) == (30, 30, 22, 8)
    assert result["partial"] is False and result["failed"] == 0
    assert result["fps"] == pytest.approx(result["frames_timed"] / result["elapsed_s"])
    assert result["top1"] == pytest.approx(result["top1_correct"] / 30)
    config = result["config"]
    assert (config["model"], config["weights"], config["dtype"], config["compile"]) == (
        "test_efficientnet", "random", "float32", False)  # fmt: skip
    assert (config["input_size"], config["crop_pct"], config["decoder"], config["device"]) == (
        [3, 160, 160], 0.95, "ffmpeg", "cpu")  # fmt: skip
    assert {"python", "torch", "timm", "spdl", "ffmpeg", "device_name", "cpu_count"} <= result["env"].keys()
    assert result["env"]["ffmpeg"]["libavcodec"].startswith("59.")
    # What the CPU figures depend on: the CPUs this process may use, and torch's threads (in a subprocess).
    assert result["env"]["cpus_usable"] == len(os.sched_getaffinity(0)) and result["env"]["torch_threads"] >= 1
    _assert_accounted(result)


def test_default_compile_and_bf16_with_short_run_warns(jpeg_set, tmp_path, capfd):
    out = tmp_path / "results.json"  # in this process: what the run reports is checked, not the process
    proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--max-samples", "10",
                    "--batch-size", "4", "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "not more than the warm-up: FPS includes it" in proc.stdout
    result = read_json(out)
    native_bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()  # --dtype auto follows the hardware
    expected = (False, "bfloat16" if native_bf16 else "float32")  # no compile on the CPU unless asked for
    assert (result["config"]["compile"], result["config"]["dtype"]) == expected
    assert (result["listed"], result["classified"], result["frames_timed"]) == (10, 10, 10)  # last batch: 2 images
    assert result["warmup_included"] is True


def test_compile_modes_accepted_and_refused(jpeg_set, capsys):
    # The CLI offers torch.compile's modes; the library takes True (mode default), False or a mode.
    with pytest.raises(SystemExit) as refused:  # argparse's usage error
        main(["--input-flist", str(jpeg_set), *TINY, "--compile-mode", "fast"])
    assert refused.value.code == 2
    assert "--compile-mode: invalid choice: 'fast'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="compile='fast': True, False or one of default, reduce-overhead"):
        get_model("test_efficientnet", "cpu", pretrained=False, compile="fast")
    bundle = get_model("test_efficientnet", "cpu", pretrained=False, compile="default", dtype="float32")
    assert type(bundle.model).__name__ == "OptimizedModule"  # compiled lazily, on the first batch


def test_trace_writes_both_traces(jpeg_set, tmp_path):
    proc = run_cli("--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--no-compile",
                   "--batch-size", "8", "--trace", tmp_path / "run")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run.json").stat().st_size > 0 and (tmp_path / "run.pftrace").stat().st_size > 0
    # It says where they are, and a CPU run prints no error about GPUs it never asked for.
    assert f"trace: {tmp_path / 'run'}.json (torch's profiler) and {tmp_path / 'run'}.pftrace" in proc.stderr
    assert "gpuGetDeviceCount" not in proc.stderr and "ERROR" not in proc.stderr


def test_a_trace_says_it_read_only_the_first_images(jpeg_set, monkeypatch, caplog):
    # 'listed' is the traced images: the log says why, when the list was cut (not by --max-samples).
    import imagenet_classification as ic

    caplog.set_level("INFO", logger=ic.__name__)
    monkeypatch.setattr(ic, "TRACE_BATCHES", 4)  # 16 of the 30 images, in batches of 4
    args = ["--input-flist", str(jpeg_set), "--prefix", f"{jpeg_set.parent}/", "--batch-size", "4", "--trace", "t"]
    assert len(ic._read_images(ic._parse_args(args))) == 16
    assert "--trace: the first 16 images only (4 batches), the list read no further." in caplog.text
    caplog.clear()
    assert len(ic._read_images(ic._parse_args([*args, "--max-samples", "16"]))) == 16
    assert "--trace" not in caplog.text  # cut where --max-samples asked


def test_gpu_decoder_without_cuda_stops_at_start(jpeg_set):
    for flag in ("--use-nvjpeg", "--use-nvdec"):
        proc = run_cli("--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, flag)
        assert proc.returncode == 2
        assert f"error: {flag} decodes on a CUDA GPU, but this run uses cpu" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_cuda_device_without_cuda_is_a_usage_error(jpeg_set):
    proc = run_cli("--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", "--device", "cuda:0")
    assert proc.returncode == 2 and "CUDA is not available on this machine" in proc.stderr


def test_unknown_wnid_names_list_and_line(tmp_path):
    flist = tmp_path / "val.flist"
    flist.write_text("val/n01440764/a.JPEG\nval/n12345678/b.JPEG\n")
    proc = run_cli("--input-flist", flist, *TINY)
    assert proc.returncode == 2
    assert f"error: {flist}:2: n12345678 is not one of the 1000 ImageNet classes" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_undecodable_file_stops_the_run(jpeg_set, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(jpeg_set.parent / "val", root / "val")
    lines = jpeg_set.read_text().splitlines()
    (root / lines[13]).write_bytes(b"\x00garbage" * 100)
    out = tmp_path / "results.json"
    proc = run_cli("--input-flist", jpeg_set, "--prefix", f"{root}/", *TINY, "--no-compile", "--batch-size", "4",
                   "--results-file", out)  # fmt: skip
    assert proc.returncode == 1
    assert f"error: cannot decode {root / lines[13]}: not an image" in proc.stderr
    assert "(PARTIAL RUN)" in proc.stdout and "Traceback" not in proc.stderr
    result = read_json(out)
    assert result["partial"] is True and result["failed"] == 1 and result["classified"] < 29
    assert result["failures"][0]["path"] == str(root / lines[13])
    _assert_accounted(result)


def test_the_list_is_read_once_so_a_list_changed_mid_run_changes_nothing(jpeg_set, tmp_path):
    flist = tmp_path / "growing.flist"
    lines = [f"{jpeg_set.parent}/{line}" for line in jpeg_set.read_text().splitlines()]
    flist.write_text("\n".join(lines * 8) + "\n")  # 240 images
    out = tmp_path / "r.json"
    cmd = [sys.executable, str(ROOT / "imagenet_classification.py"), "--input-flist", str(flist), *TINY,
           "--no-compile", "--batch-size", "4", "--results-file", str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while "images listed" not in proc.stderr.readline():
        assert time.monotonic() < deadline and proc.poll() is None
    with open(flist, "a") as f:  # appended while the run goes on, as a list still being written
        f.write("\n".join(lines * 8) + "\n")
    flist.write_text("")  # ... and then emptied
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    result = read_json(out)
    assert (result["listed"], result["classified"], result["failed"], result["not_reached"]) == (240, 240, 0, 0)


def test_a_list_from_standard_input(jpeg_set, tmp_path):
    out = tmp_path / "r.json"
    text = "".join(f"{jpeg_set.parent}/{line}\n" for line in jpeg_set.read_text().splitlines()[:10])
    cmd = [sys.executable, str(ROOT / "imagenet_classification.py"), "--input-flist", "-", *TINY, "--no-compile",
           "--batch-size", "4", "--results-file", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, input=text, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (read_json(out)["listed"], read_json(out)["classified"]) == (10, 10)
    assert read_json(out)["config"]["images_from"] == "<stdin>"


def test_help_shows_every_default():
    proc = run_cli("--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for flag, default in (("--batch-size", "32"), ("--num-threads", "16"), ("--queue-size", "16"),
                          ("--warmup-batches", "20"), ("--timeout", "120.0"), ("--device", "auto"),
                          ("--dtype", "auto"), ("--model", "mobilenetv3_large_100"), ("--max-image-mb", "64"),
                          ("--check-decoder", "8"), ("--loader", "spdl"), ("--max-samples", "all")):  # fmt: skip
        assert re.search(rf"{flag} \S+ .*?\(default: {re.escape(default)}\)", text), flag


def readme_notebook_code() -> str:
    """The Python of README's section "In a notebook", as written."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## In a notebook") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("\n```", start)]


def run_in_the_demo(
    code: str, demo_photos: Path, lite0_checkpoint: Path, tmp_path: Path
) -> subprocess.CompletedProcess:
    """``python -c code`` in a folder laid out as ``make demo`` lays out demo/ (photos, list, weights)."""
    (tmp_path / "demo").mkdir()
    shutil.copytree(demo_photos.parent / "val", tmp_path / "demo" / "val")
    shutil.copy(demo_photos, tmp_path / "demo" / "val.flist")
    shutil.copy(lite0_checkpoint, tmp_path / "demo" / "efficientnet_lite0.pth")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip


def test_the_readme_notebook_section_runs_as_written(demo_photos, lite0_checkpoint, tmp_path):
    proc = run_in_the_demo(readme_notebook_code(), demo_photos, lite0_checkpoint, tmp_path)
    assert proc.returncode == 0, proc.stderr
    fps, top1, top5, not_reached = proc.stdout.splitlines()[-1].split()
    assert float(fps) > 0 and float(top1) >= 0.9 and float(top5) == 1.0 and not_reached == "0"
    assert "WarmupIncluded" not in proc.stderr and "leaked" not in proc.stderr, proc.stderr  # as written, clean
