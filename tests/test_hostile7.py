"""Hostile input, rounds seven to nine: flags whose meaning hung on their order or that were taken and
ignored, a signal while the files are written, a run with no batch, torchrun on a short list, the
breakdown's and the sweep's figures. Each test fails on the code before it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

import imagenet_classification as ic
from tests.conftest import TINY, make_jpeg_set, read_json, run_main, write_jpeg

FAST = [*TINY, "--no-compile", "--batch-size", "4", "--warmup-batches", "1"]


def _refused(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        ic._parse_args(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err


# --- Flags whose result hung on their order ---------------------------------------------------------


def test_amp_and_no_bf16_mean_the_same_in_any_order_or_are_refused(capsys):
    # --amp and --no-bf16 wrote --dtype's value: the last flag typed won, float16 silently bfloat16.
    for argv in (["--amp-dtype", "float16", "--amp"], ["--amp", "--amp-dtype", "float16"]):
        assert ic._parse_args(["/d", *argv]).dtype == "float16"
    assert ic._parse_args(["/d", "--amp"]).dtype == "auto"
    assert ic._parse_args(["/d", "--no-bf16"]).dtype == "float32"
    assert ic._parse_args(["/d", "--no-bf16", "--dtype", "float32"]).dtype == "float32"
    for argv, words in (
        (["--no-bf16", "--dtype", "bfloat16"], "--no-bf16 is --dtype float32; not bfloat16"),
        (["--dtype", "float16", "--no-bf16"], "--no-bf16 is --dtype float32; not float16"),
        (["--amp", "--no-bf16"], "--amp asks for reduced precision; --no-bf16 for float32"),
        (["--no-bf16", "--amp"], "--amp asks for reduced precision; --no-bf16 for float32"),
        (["--dtype", "float32", "--amp"], "--amp asks for reduced precision; --dtype float32 says not to"),
    ):
        assert words in _refused(capsys, ["/d", *argv]), argv


# --- Flags taken and ignored --------------------------------------------------------------------------


def test_the_torch_loader_refuses_a_queue_size_and_takes_check_decoder_0(capsys):
    assert "--queue-size sizes SPDL's queue" in _refused(capsys, ["/d", "--loader", "torch", "--queue-size", "4"])
    assert ic._parse_args(["/d", "--loader", "torch"]).queue_size == 0  # the results say it has none
    assert ic._parse_args(["/d"]).queue_size == ic.QUEUE_SIZE == 16
    assert ic._parse_args(["/d", "--loader", "torch", "--check-decoder", "0"]).check_decoder == 0  # off: was refused
    refused = _refused(capsys, ["/d", "--loader", "torch", "--check-decoder", "2"])
    assert "--check-decoder checks a GPU decoder" in refused
    # A single queue size was taken by the sweep of a loader with no queue.
    with pytest.raises(ic.InputError, match="--loader torch has no queue"):
        ic._sweep_grid(ic._parse_args(["/d", "--loader", "torch", "--sweep", "queue-size=8"]), 10)


def test_the_sweeps_recommended_command_for_the_torch_loader_runs(tmp_path):
    # It printed --queue-size, which that loader ignored (and now refuses).
    typed = ["python", "x.py", str(tmp_path), "--loader", "torch", "--sweep", "auto"]
    grid = ic._sweep_grid(ic._parse_args(typed[2:]), 10)
    point = ic._SweepPoint(1, 4, grid["queue-size"][0], loader_fps=1.0, model_fps=1.0)
    again = ic._with_settings(typed, point)
    assert "--queue-size" not in again
    assert ic._parse_args(again[2:]).num_threads == 1
    assert "--queue-size 16" in ic._SweepPoint(1, 4, 16, 1.0, 1.0).flags()


# --- Whole numbers too large for a float ------------------------------------------------------------


def test_a_label_or_count_too_large_for_a_float_is_refused_not_an_overflow():
    assert ic._whole(10**400, 1) and not ic._whole(10**400, 0, 999)  # was OverflowError from math.isfinite
    with pytest.raises(ValueError, match="a.JPEG: label 1000.* is no class index"):
        ic.ImageList(("a.JPEG",), (10**400,))
    for size in (10**400, 2**31):  # a C int holds it in SPDL: an OverflowError there, or a coroutine never run
        with pytest.raises(ValueError, match=f"batch_size={size}: expected at least 1"):
            ic.get_pipeline([("a", 0)], size, lambda items: items, 1, 1, 1)
        with pytest.raises(ValueError, match=f"batch_size={size}: .* at most {2**31 - 1}"):  # padding to it
            ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False, batch_size=size)


# --- A signal while the files are written ------------------------------------------------------------


def test_a_signal_while_the_files_are_written_is_said_and_the_files_are_whole(capfd, jpeg_set, tmp_path, monkeypatch):
    write = ic._write_results

    def write_then_signalled(path, report):  # SIGTERM arrives as the results are written
        os.kill(os.getpid(), signal.SIGTERM)
        return write(path, report)

    monkeypatch.setattr(ic, "_write_results", write_then_signalled)
    out = tmp_path / "r.json"
    proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *FAST, "--results-file", out)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    # It exited 143 with no word of why.
    assert "error: interrupted by SIGTERM while the report was written; the run had ended" in proc.stderr
    result = read_json(out)
    assert (result["partial"], result["classified"], result["listed"]) == (False, 30, 30)


# --- A run stopped before its first batch ------------------------------------------------------------


def test_a_run_stopped_before_its_first_batch_draws_no_plot_and_warns_of_no_warmup(capfd, tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "bad.JPEG").write_bytes(b"not a jpeg")
    flist = tmp_path / "l.flist"
    flist.write_text("bad.JPEG 0\n")
    plot = tmp_path / "t.png"
    proc = run_main(capfd, "--input-flist", flist, "--prefix", f"{tmp_path}/", *FAST, "--plot", plot)
    assert proc.returncode == ic.EXIT_FAILED, proc.stderr
    assert not plot.exists()  # an empty plot was drawn
    assert f"note: {plot} not drawn: the run stopped before its first batch" in proc.stderr
    assert "warm-up" not in proc.stdout  # there was no FPS to include it in


def test_the_plots_last_occupancy_bin_reaches_the_runs_end(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    saved = []
    monkeypatch.setattr(ic, "_save", lambda fig, ax, path: saved.append(fig))
    timeline = {
        "interval_s": 1.0, "images": [4, 4, 2], "batch_end_s": [0.5, 1.5, 2.5], "batch_images": [4, 4, 2],
        "warmup_end_s": 0.5, "window_end_s": 2.5, "end_s": 2.6, "sink_occupancy": [0.2, 0.5, 1.0],
    }  # fmt: skip
    assert ic._plot_timeline(timeline, tmp_path / "t.png")
    step = saved[0].axes[1].lines[0]  # the twin axis: the sink's occupancy
    assert (list(step.get_xdata())[-1], list(step.get_ydata())[-1]) == (2.6, 1.0)  # it stopped at 2.0


# --- measure_loader's device -------------------------------------------------------------------------


def test_measure_loader_refuses_a_device_this_machine_lacks_as_get_model_does():
    # "meta" timed nothing at 2.5 million images/s; "cuda" without CUDA raised torch's driver error.
    batches = [(torch.zeros((2, 3, 8, 8), dtype=torch.uint8), torch.zeros((2, 1), dtype=torch.int64))] * 3
    for device in ("meta", "cuda:0" if not torch.cuda.is_available() else "cuda:99"):
        with pytest.raises(ic.InputError, match=device):
            ic.measure_loader(iter(batches), device, 1)


# --- The results file's --max-bad --------------------------------------------------------------------


def test_the_results_file_keeps_max_bad_as_given(jpeg_set):
    data = ["--input-flist", str(jpeg_set), "--prefix", f"{jpeg_set.parent}/", *FAST, "--skip-bad", "--max-bad"]
    for given in ("1281167", "33.33333333%", "10%", "0.5%", "0"):  # 1281167 was written as 1.28117e+06
        config = ic._preflight(ic._parse_args([*data, given]), ic._Shard())
        assert config.to_dict()["max_bad"] == given


# --- get_pipeline's items ------------------------------------------------------------------------------


def test_a_decode_item_that_is_no_path_and_label_is_named(tmp_path):
    # Bare paths failed in each decode thread with "too many values to unpack", and the run's
    # error said only "the log above says why".
    path = str(write_jpeg(tmp_path / "a.JPEG", (64, 48), (200, 30, 30)))
    decode = ic.get_decode_func("cpu", ic.EvalTransform(size=32))
    with pytest.raises(TypeError, match="a.JPEG': expected a \\(path, label\\) pair"):
        decode([path])
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    with pytest.raises(ic.RunStopped, match="TypeError: .*a.JPEG': expected a \\(path, label\\) pair") as stop:
        ic.benchmark(ic.get_pipeline([(path, 0), (path, 1), path], 2, decode, 1, 1, 1), model, listed=3)
    assert stop.value.result.classified == 2


def test_a_sweep_setting_after_another_flag_is_named(capsys, tmp_path):
    # argparse took it for DATA_DIR: "argument DATA_DIR: not allowed with argument --input-flist".
    for argv in (["--sweep", "num-threads=1", "--skip-bad", "batch-size=4", "--input-flist", "l"],
                 ["--sweep=auto", "batch-size=4", "/d"]):  # fmt: skip
        assert "batch-size=4: a --sweep setting after another flag" in _refused(capsys, argv)
    assert ic._parse_args(["--sweep", "auto", "batch-size=4", "--skip-bad", "/d"]).sweep == ["auto", "batch-size=4"]
    folder = tmp_path / "batch-size=4"  # a folder of that name is DATA_DIR, as the parser takes it
    folder.mkdir()
    assert ic._parse_args(["--sweep", "auto", "--skip-bad", str(folder)]).data_dir == folder


# --- The breakdown's reading alone ---------------------------------------------------------------------


def test_reading_alone_hands_on_batches_as_they_complete_not_after_a_slow_one(tmp_path):
    # In list order, the batches read while the second (60 MB) was read were handed on at once
    # after it, in the timed window: 450,000 images/s where 3,000-20,000 were read.
    small = write_jpeg(tmp_path / "small.JPEG", (64, 48), (200, 30, 30))
    big = tmp_path / "big.JPEG"
    with big.open("wb") as f:  # 512 MiB, sparse: written at once, read in about 0.1 s
        f.write(small.read_bytes())
        f.truncate(512 << 20)
    items = [(str(small), 0), (str(big), 0)] + [(str(small), 0)] * 30
    sizes = [size for _, size, _ in ic._read_batches(items, 1, 2, 600 << 20, 60.0)]
    assert sorted(sizes) == sorted([small.stat().st_size] * 31 + [big.stat().st_size])
    assert sizes.index(big.stat().st_size) > 1, sizes  # the others came while it was read


# --- The sizes that ran ----------------------------------------------------------------------------------


def test_the_results_give_the_batch_size_that_ran_not_the_flag(jpeg_set):
    # --batch-size 100 on 13 images ran one batch of 13: the JSON and the plot's title said 100, the CSV 13.
    data = ["--input-flist", str(jpeg_set), "--prefix", f"{jpeg_set.parent}/", *TINY, "--no-compile"]
    config = ic._preflight(ic._parse_args([*data, "--batch-size", "100", "--max-samples", "13"]), ic._Shard())
    assert (config.batch_size, config.to_dict()["batch_size"]) == (13, 13)
    config = ic._preflight(ic._parse_args([*data, "--batch-size", "8", "--max-samples", "13"]), ic._Shard())
    assert config.batch_size == 8


def test_a_breakdown_whose_passes_include_their_warmup_says_so(capfd, jpeg_set, tmp_path):
    # Only FPS's warning was printed; the three rates below it were timed from their start, unsaid.
    data = ["--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--no-compile", "--batch-size", "4"]
    for warmup, included in (("20", True), ("0", False)):
        out = tmp_path / f"r{warmup}.json"
        proc = run_main(
            capfd, *data, "--max-samples", "8", "--warmup-batches", warmup, "--breakdown", "--results-file", out
        )
        assert proc.returncode == 0, proc.stderr
        said = "WARNING: as FPS, each rate below includes its warm-up" in proc.stdout
        result = read_json(out)
        assert (said, result["warmup_included"], "breakdown" in result) == (included, included, True), proc.stdout


# --- The sweep's failures ---------------------------------------------------------------------------------


def test_the_sweep_counts_a_failed_line_each_time_as_a_run_does(capfd, tmp_path):
    # The end-to-end pass reads further than the loader-alone passes: a path they had failed on was
    # left out when listed again, one they had not was counted each time (3 of the 4 lines).
    flist = make_jpeg_set(tmp_path, 20)
    good = flist.read_text().split()
    for name in ("x_n01440764.JPEG", "y_n01440764.JPEG"):
        (tmp_path / name).write_bytes(b"")
    x, y = "x_n01440764.JPEG", "y_n01440764.JPEG"
    lines = [x, *good[:11], x, y, y, *good[11:20]]
    flist.write_text("\n".join(lines) + "\n")
    out = tmp_path / "s.json"
    sweep = ["--sweep", "num-threads=1", "batch-size=1", "queue-size=1"]
    proc = run_main(capfd, "--input-flist", flist, "--prefix", f"{tmp_path}/", *FAST, *sweep, "--results-file", out)
    assert proc.returncode == 0, proc.stderr
    failures = [Path(f["path"]).name for f in read_json(out)["sweep"]["failures"]]
    assert failures == [x, x, y, y], failures


def test_the_plots_first_batch_is_the_first_that_ran_the_model(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    saved = []
    monkeypatch.setattr(ic, "_save", lambda fig, ax, path: saved.append(fig))
    timeline = {
        "interval_s": 1.0, "images": [8], "batch_end_s": [0.01, 0.25, 0.5], "batch_images": [0, 4, 4],
        "warmup_end_s": 0.25, "window_end_s": 0.5, "end_s": 0.6,
    }  # fmt: skip
    assert ic._plot_timeline(timeline, tmp_path / "t.png")
    (band,) = saved[0].axes[0].patches  # the first batch's, to 0.25: it was the empty one's, to 0.01
    assert (band.get_x(), band.get_x() + band.get_width()) == (0, 0.25)


def test_with_no_batch_drained_the_rate_while_loading_is_fps_itself():
    # Taken from the timeline's times (rounded to the microsecond), it differed from FPS in the 6th digit.
    result = ic.RunResult(listed=8, classified=8, frames_timed=4, elapsed_s=0.33333334 - 0.12345671, batches_timed=1)
    result.timeline = {"started_at": 100.0, "batch_end_s": [0.123457, 0.333333], "batch_images": [4, 4],
                       "warmup_end_s": 0.12345671}  # fmt: skip
    ic._add_drain(result, loader_end=101.0)
    assert (result.drained_batches, result.fps_while_loading) == (0, result.fps)
