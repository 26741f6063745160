"""Hostile input, round seventeen (2026-12-07). Each test fails on the code before it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import imagenet_classification as ic
from tests.conftest import ROOT, read_json
from tests.test_helper_scripts import _one_error_line, _run


def test_a_stop_raised_after_a_held_signal_is_the_signals():
    # killpg's SIGTERM (torchrun, systemd, `timeout`) ends the DataLoader's workers too. It came as the
    # batch was counted, and was held there; torch's SIGCHLD handler then raised the workers' death in
    # the same block: exit 1, "the DataLoader failed", and the signal lost (CI, once).
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    size = model.transform.size
    batch = (torch.zeros(2, 3, size, size, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.int64))
    calls = []

    def signal_then_workers_gone() -> None:  # the run's start clock passes; the warm-up's end is hit
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # its handler runs: the signal is held
            raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Terminated. ")

    with pytest.raises(ic.RunInterrupted) as stopped:
        ic.benchmark([batch, batch], model, warmup_batches=1, sync_clocks=signal_then_workers_gone)
    assert stopped.value.signum == signal.SIGINT and len(calls) == 2
    assert stopped.value.result.partial and stopped.value.result.classified == 2
    assert stopped.value.result.stop_reason == "interrupted by SIGINT"


def test_images_and_labels_of_the_wrong_kind_are_refused_by_hand():
    # make mutate's classification group: an `and` for an `or` in either check went unseen there.
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False, dtype="float32")
    size = model.transform.size
    for shape in ((3, size, size), (2, size, size, 3), (2, 1, size, size)):  # one image; channels last; grey
        with pytest.raises(ValueError, match=rf"images of shape \({', '.join(map(str, shape))}\): expected N x 3"):
            model.logits(torch.zeros(shape, dtype=torch.uint8))
    logits = torch.eye(4)
    assert [int(hits) for hits in model.classification(logits, torch.arange(4))] == [4, 4]
    for labels in (torch.arange(4).float(), torch.arange(4).to(torch.complex64), torch.ones(4, dtype=torch.bool)):
        with pytest.raises(ValueError, match=rf"labels of type {labels.dtype}: expected whole numbers"):
            model.classification(logits, labels)


def _configured(**config) -> torch.nn.Module:
    """A module with a timm pretrained config of its own, as from_model reads it."""
    module = torch.nn.Identity()
    grey = (0.5, 0.5, 0.5)
    module.pretrained_cfg = {"input_size": (3, 32, 32), "crop_pct": 1.0, "interpolation": "bilinear",
                             "mean": grey, "std": grey, "crop_mode": "center", **config}  # fmt: skip
    return module


def test_a_transform_from_a_config_the_loader_cannot_reproduce_is_refused_by_hand():
    # make mutate's geometry group: 23 mutants of from_model's refusals went unseen there (the CLI's
    # tests of them are in other files). A fixed size that is not square was said as a square one.
    def refused(module, overrides=None) -> tuple[str, str]:
        with pytest.raises(ic.InputError) as error:
            ic.EvalTransform.from_model(module, overrides)
        return str(error.value), error.value.flag

    assert refused(_configured(input_size=(3, 24, 32))) == (
        "its evaluation transform cannot be reproduced here: its input is 32 x 24, not square",
        "--model",
    )
    fixed = _configured(fixed_input_size=True)
    assert ic.EvalTransform.from_model(fixed).size == 32  # its own size
    assert refused(fixed, {"input_size": (3, 48, 48)}) == (
        "its input size is fixed at 32 x 32: the model refuses a 48 x 48 image",
        "--img-size",
    )
    tested = _configured(fixed_input_size=True, test_input_size=(3, 40, 40))  # evaluated at its test size
    assert ic.EvalTransform.from_model(tested).size == 40
    assert refused(tested, {"input_size": (3, 32, 32)})[0].startswith("its input size is fixed at 40 x 40")
    wide = _configured(fixed_input_size=True, input_size=(3, 24, 40))  # no square size is the model's
    assert refused(wide, {"input_size": (3, 40, 40)})[0].startswith("its input size is fixed at 40 x 24:")
    # 161 / 0.0113 = 14247.8: floored, as the resize is; over the pixel limit, as 1 / 1.5 is under one pixel.
    assert refused(_configured(), {"input_size": (3, 161, 161), "crop_pct": 0.0113}) == (
        "161 / 0.0113 resizes each image's shorter side to 14247 pixels: every image would be over the limit of "
        "178,956,970", "--crop-pct")  # fmt: skip
    assert refused(_configured(), {"input_size": (3, 1, 1), "crop_pct": 1.5}) == (
        "1 / 1.5 resizes each image's shorter side to 0 pixels",
        "--crop-pct",
    )
    assert ic.EvalTransform.from_model(_configured(), {"input_size": (3, 1, 1)}).resize_short == 1
    assert ic.EvalTransform.from_model(_configured(), {"crop_pct": 0.0125}).resize_short == 2560


# --- The bench scripts (a sweep of bench/ under bad input) -------------------------------------------


@pytest.mark.parametrize(
    "args, words",
    [
        (["--layouts", "0x4"], "argument --layouts: 0x4: expected PROCESSESxTHREADS"),  # named as the --threads leg
        (["--layouts", "4y4"], "argument --layouts: 4y4: expected PROCESSESxTHREADS"),
        (["--decoders", "bogus"], "argument --decoders: bogus: 'bogus' is none of ffmpeg, nvjpeg, nvdec"),
        (["--images", "0"], "argument --images: 0: expected a whole number, 1 or more"),
        (["--threads", "0"], "argument --threads: 0: expected a whole number, 1 or more"),  # each leg failed, exit 0
        ([], "photos/val.flist lists no photo as val/WNID/NAME"),  # scikit-image's photos were taken instead
    ],
)
def test_gpu_checks_arguments_are_refused_before_any_leg(tmp_path, args, words):
    bundle = tmp_path / "bundle"
    (bundle / "photos").mkdir(parents=True)
    (bundle / "photos" / "val.flist").write_text("" if not args else "val/n01440764/a.JPEG\n")
    (bundle / "efficientnet_lite0.pth").write_bytes(b"")
    proc = _run(sys.executable, ROOT / "bench" / "gpu_check.py", "--bundle", bundle, "--out", tmp_path / "out",
                "--scratch", tmp_path / "scratch", "--device", "cpu", *args)  # fmt: skip
    _one_error_line(proc, words)
    assert not (tmp_path / "scratch" / "images").exists()


def test_compare_loaders_checks_its_model_and_results_file_first_and_warns_of_a_short_window(tmp_path):
    # The model's name was checked after every loader's repeats (an InputError's traceback, no results),
    # and a results.json that is a folder lost the whole run; 192 images at 2 threads printed loader
    # rates of batches decoded before the clock started, with no word.
    script, out = ROOT / "bench" / "compare_loaders.py", tmp_path / "out"
    proc = _run(sys.executable, script, "--out", out, "--images", "192", "--max-threads", "2", "--model", "nosuch")
    _one_error_line(proc, "argument --model: 'nosuch' is not a timm model")
    warning = ("compare_loaders.py: warning: --images 192: at 2 threads the loader's timed window of 1 batches opens "
               "with up to 2 under way: its rates may be that of batches already decoded (--images 864 keeps it "
               "within 10%)")  # fmt: skip
    assert warning in proc.stderr.splitlines() and not (out / "images").exists()
    (out / "results.json").mkdir()
    proc = _run(sys.executable, script, "--out", out, "--images", "2000", "--max-threads", "2")
    _one_error_line(proc, f"argument --out: {out / 'results.json'}: a folder, not a file")
    warning = "at 2 threads the loader's timed window of 57 batches opens with up to 2 under way"
    assert warning not in proc.stderr and not (out / "images").exists()  # 2 / 55: within 10 %


def test_read_ceiling_needs_its_warm_up_and_a_batch_to_time(tmp_path):
    proc = _run(sys.executable, ROOT / "bench" / "read_ceiling.py", "--out", tmp_path / "out", "--images", "64")
    _one_error_line(proc, "argument --images: 64: at least 96 images (2 warm-up batches of 32 and 1 to time)")


def test_two_mixes_made_in_one_folder_keep_their_own_images(tmp_path, monkeypatch):
    # The same names in one folder: gil.py's imagenet set then its default set wrote 37 of the
    # imagenet list's 192 files over with default-mix images, which the list went on reading.
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from compare_loaders import make_image_set

    default = make_image_set(tmp_path, 12)
    before = {line: (tmp_path / line).read_bytes() for line in default.read_text().splitlines()}
    mixed = make_image_set(tmp_path, 12, mix="imagenet")
    assert {line: (tmp_path / line).read_bytes() for line in default.read_text().splitlines()} == before
    assert not set(mixed.read_text().splitlines()) & set(before)
    assert make_image_set(tmp_path, 12) == default and make_image_set(tmp_path, 12, mix="imagenet") == mixed


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_helper_script_stopped_by_a_signal_says_so_in_one_line(tmp_path, signum):
    # Ctrl-C ended every bench/ and scripts/ program with a KeyboardInterrupt traceback; SIGTERM
    # (`timeout`) skipped their clean-up: gil.py left its uprobe on the system's libpython.
    cmd = [sys.executable, str(ROOT / "scripts" / "make_demo_data.py"), str(tmp_path / "demo"), "--variants", "100000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "demo").glob("val/*/*.JPEG")) and time.monotonic() < deadline:
        time.sleep(0.1)  # writing its images
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signum and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines() == [f"make_demo_data.py: interrupted by {signal.Signals(signum).name}"], err


def test_a_signal_during_the_breakdowns_decode_processes_stops_within_two_seconds(tmp_path):
    # The breakdown's loader alone waited for its worker pool (3.6-6.7 s) where the run and the sweep
    # end theirs at once.
    from tests.test_processes import _start_in_two_processes

    proc, out = _start_in_two_processes(tmp_path, "--max-samples", "320", "--breakdown")
    while "Breakdown: timing the loader alone" not in (line := proc.stderr.readline()):
        assert line or proc.poll() is None, "the run ended before its breakdown"
    time.sleep(1.0)  # the loader alone's workers starting, or decoding
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and time.monotonic() - sent < 2.0, (time.monotonic() - sent, err[-2000:])
    result = read_json(out)
    assert result["breakdown_cut"] == "interrupted by SIGTERM" and result["partial"] is False


def test_a_gpu_check_leg_that_fails_carries_no_result_of_an_earlier_run(tmp_path, monkeypatch):
    # Rerun into the same --out, a leg that failed (exit 2) still carried the last run's results file.
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from gpu_check import run_leg

    (tmp_path / "ffmpeg.json").write_text('{"num_threads": 1}')
    with open(tmp_path / "log", "w") as log:
        entry = run_leg("ffmpeg", ["--num-threads", "0"], tmp_path, 120, log)
    assert entry["exit"] == 2 and "result" not in entry and "--num-threads" in entry["error"], entry
