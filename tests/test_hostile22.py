"""Hostile input, round twenty-two (2026-12-08): the notebook API's edges. Each test fails on the
code before it."""

from __future__ import annotations

import errno
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch
from PIL import Image

import imagenet_classification as ic
from imagenet_classification import BadImagePolicy, RunStopped, WarmupIncluded
from tests.conftest import ROOT, run_main


class _Ranked(torch.nn.Module):
    """Logits that rank class 10 first for every image."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros((x.shape[0], ic.NUM_CLASSES))
        logits[:, 10] = 1.0
        return logits


def _bundle() -> ic.ModelBundle:
    transform = ic.EvalTransform(size=8)
    return ic.ModelBundle(ic.Preprocessing(transform.mean, transform.std), _Ranked(), ic.Classification(),
                          torch.float32, transform)  # fmt: skip


def _batch(n: int, failed: int = 0) -> ic._Batch:
    """``n`` images labelled 10 (each a top-1 hit), and ``failed`` bad images listed with them."""
    images, labels = torch.zeros((n, 3, 8, 8), dtype=torch.uint8), torch.full((n, 1), 10)
    bad = [ic.ImageDecodeError(f"/no/such/{i}.JPEG", "no such file") for i in range(failed)]
    return ic._Batch(images, labels, tuple(f"/x/{i}.JPEG" for i in range(n)), bad)


def test_bad_images_past_the_listed_are_not_counted_as_failed():
    # A loader that delivered two bad images past the 4 listed: they were counted as failed
    # (failed=2) before the check of what was delivered stopped the run, so the counts added up to 6.
    with pytest.raises(RunStopped, match="more than the 4 listed") as stop:
        ic.benchmark([_batch(4), _batch(0, failed=2)], _bundle(), listed=4, policy=BadImagePolicy(skip=True),
                     warmup_batches=0)  # fmt: skip
    result = stop.value.result
    assert (result.classified, result.failed, result.not_reached) == (4, 0, 0)
    assert result.classified + result.failed + result.not_reached == result.listed
    with pytest.raises(RunStopped, match="more than the 4 listed") as stop:  # images past it: never classified
        ic.benchmark([_batch(3), _batch(2)], _bundle(), listed=4, warmup_batches=0)
    assert (stop.value.result.classified, stop.value.result.not_reached) == (3, 1)
    with pytest.raises(RunStopped, match="more than the 4 listed") as stop:  # the bad images before count too
        ic.benchmark([_batch(2, failed=1), _batch(2)], _bundle(), listed=4, policy=BadImagePolicy(skip=True),
                     warmup_batches=0)  # fmt: skip
    assert (stop.value.result.classified, stop.value.result.failed, stop.value.result.not_reached) == (2, 1, 1)


def test_a_window_whose_every_image_failed_is_warned_of_in_a_notebook():
    # The command line says "FPS measures nothing"; benchmark() and measure_loader() returned a
    # plain fps of 0.0, with no warning, which reads as a measured rate.
    loader = [_batch(2), _batch(2), _batch(0, failed=2)]
    message = r"every image of the FPS window \(the batches after the warm-up\) failed: FPS measures nothing"
    with pytest.warns(WarmupIncluded, match=message):
        result = ic.benchmark(loader, _bundle(), warmup_batches=2, policy=BadImagePolicy(skip=True))
    assert (result.fps, result.frames_timed, result.batches_timed, result.warmup_included) == (0.0, 0, 1, False)
    with pytest.warns(WarmupIncluded, match=message):
        assert ic.measure_loader(loader, "cpu", 2) == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a window with an image in it: no warning
        ic.benchmark([*loader, _batch(1)], _bundle(), warmup_batches=2, policy=BadImagePolicy(skip=True))


def test_a_bare_time_out_of_a_progress_callback_is_its_own_error_not_a_stall():
    # A TimeoutError() with no message from the progress callback was reported as the loader's stall.
    def progress(done: int, top1: torch.Tensor) -> None:
        raise TimeoutError

    with pytest.raises(TimeoutError):
        ic.benchmark([_batch(2)], _bundle(), warmup_batches=0, progress=progress)

    def stalls():  # the loader's own bare time-out: a stall, as before
        yield _batch(2)
        raise TimeoutError

    with pytest.raises(RunStopped) as stop:
        ic.benchmark(stalls(), _bundle(), warmup_batches=0)
    assert stop.value.kind == "stalled"


def test_the_loop_s_warnings_name_the_line_that_called_benchmark():
    # stacklevel=4 named the caller's caller: in a notebook, the kernel's exec line, whose
    # once-per-location filter then hid the warning in later cells.
    images = torch.zeros((2, 3, 16, 16), dtype=torch.uint8)  # not the transform's 8 x 8
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ic.benchmark([(images, torch.full((2, 1), 10))], _bundle(), warmup_batches=0)
    sizes = [w for w in caught if "images of 16 x 16" in str(w.message)]
    assert sizes and all(w.filename == __file__ for w in sizes), [(w.filename, str(w.message)) for w in caught]


def test_a_notebook_loaders_bad_image_counts_as_failed_and_names_the_policy():
    # A decode function with no policy raising in a notebook's own loader: the image was counted as
    # not reached (failed 0) though the stop named it, and the advice was the command line's --skip-bad.
    def loader():
        yield _batch(2)
        raise ic.ImageDecodeError("/data/bad.JPEG", "not an image")

    with pytest.raises(RunStopped, match="^cannot decode /data/bad.JPEG: not an image") as stop:
        ic.benchmark(loader(), _bundle(), listed=4, warmup_batches=0)
    assert "--skip-bad" not in stop.value.advice and "BadImagePolicy(skip=True)" in stop.value.advice
    result = stop.value.result
    assert (result.classified, result.failed, result.not_reached) == (2, 1, 1)
    assert [f["path"] for f in result.to_dict()["failures"]] == ["/data/bad.JPEG"]


def test_images_on_another_device_than_the_model_are_said_to_be_so():
    # Images on another device were "the model failed on a batch … --no-compile if torch.compile
    # failed": torch's own device error, blamed on the model.
    images = torch.zeros((2, 3, 8, 8), dtype=torch.uint8, device="meta")
    with pytest.raises(ValueError, match="^images on meta, the model on cpu: decode to the model's device"):
        ic.benchmark([(images, torch.full((2, 1), 10))], _bundle(), warmup_batches=0)


def test_scan_folder_on_a_file_says_it_is_no_folder(tmp_path):
    # A file's path was "no such folder", though it exists.
    path = tmp_path / "val.flist"
    path.write_text("n01440764/a.JPEG\n")
    with pytest.raises(ic.InputError, match="val.flist: not a folder$"):
        ic.scan_folder(path)
    with pytest.raises(ic.InputError, match="nowhere: no such folder$"):
        ic.scan_folder(tmp_path / "nowhere")


# --- make mutate's timing group: what its survivors showed no test read -----------------------


@pytest.fixture
def notebook_sigint():
    """Python's own SIGINT handler, as a notebook has it (a test runner may have set another)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _signal_on_second_call() -> Callable[[], None]:
    calls = []

    def send() -> None:
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # its handler runs: the signal is held

    return send


def test_a_notebooks_ctrl_c_as_a_batch_is_counted_stops_after_it_as_that_signal(notebook_sigint):
    # sync_clocks' second call comes inside the batch's counting, at the warm-up's end.
    with pytest.raises(ic.RunInterrupted) as stopped:
        ic.benchmark([_batch(2), _batch(2)], _bundle(), warmup_batches=1, sync_clocks=_signal_on_second_call())
    assert stopped.value.signum == signal.SIGINT and stopped.value.result.classified == 2


def _signal_in_close(monkeypatch) -> None:
    """SIGINT as the run's end writes the predictions' rows (seconds, on a long run)."""
    rows, calls = ic._prediction_rows, []

    def signalled(*batch):
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        return rows(*batch)

    monkeypatch.setattr(ic, "_prediction_rows", signalled)


def test_a_notebooks_ctrl_c_as_a_whole_run_ends_keeps_the_whole_result(monkeypatch, notebook_sigint):
    _signal_in_close(monkeypatch)
    with pytest.raises(ic.RunInterrupted) as stopped:
        ic.benchmark([_batch(2), _batch(2)], _bundle(), listed=4, warmup_batches=1, predictions=True)
    result = stopped.value.result
    assert stopped.value.signum == signal.SIGINT and not result.partial and result.classified == 4
    assert len(result.predictions) == 4


def test_a_notebooks_ctrl_c_as_a_stopping_run_ends_is_the_stop(monkeypatch, notebook_sigint):
    _signal_in_close(monkeypatch)

    def fails():
        yield _batch(2)
        raise OSError("the dataset's disk is gone")

    with pytest.raises(ic.RunInterrupted) as stopped:
        ic.benchmark(fails(), _bundle(), listed=4, warmup_batches=1, predictions=True)
    assert stopped.value.signum == signal.SIGINT and stopped.value.result.classified == 2


def test_the_image_size_warning_is_given_once_for_a_run():
    images = torch.zeros((2, 3, 16, 16), dtype=torch.uint8)  # not the transform's 8 x 8
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ic.benchmark([(images, torch.full((2, 1), 10))] * 3, _bundle(), warmup_batches=0)
    assert len([w for w in caught if "images of 16 x 16" in str(w.message)]) == 1


class _TenClasses(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros((x.shape[0], 10))


def test_the_class_count_and_label_warnings_name_the_line_that_called_benchmark():
    transform = ic.EvalTransform(size=8)
    bundle = ic.ModelBundle(ic.Preprocessing(transform.mean, transform.std), _TenClasses(), ic.Classification(),
                            torch.float32, transform)  # fmt: skip
    images = torch.zeros((2, 3, 8, 8), dtype=torch.uint8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ic.benchmark([(images, torch.tensor([[1], [20]]))], bundle, warmup_batches=0)
    said = {str(w.message).split(":")[0]: w.filename for w in caught}
    assert said == {"the model gives 10 classes, not ImageNet-1k's 1000 of the labels": __file__,
                    "1 label of the batches named no class of the model's (0-9; -1": __file__}, said  # fmt: skip


def test_measure_loader_refuses_one_image_unbatched_whatever_its_labels():
    # One 3 x H x W image would count as 3; the shape is checked on the images, not the labels.
    with pytest.raises(ValueError, match=r"^images of shape \(3, 8, 8\): expected N x 3 x H x W"):
        ic.measure_loader([(torch.zeros((3, 8, 8), dtype=torch.uint8), torch.zeros(0))], "cpu", 0)


# --- A helper's sweep of the command line's inputs ---------------------------------------------


def _grey_photo() -> np.ndarray:
    from skimage import data

    return np.asarray(Image.fromarray(data.astronaut()).convert("L").resize((96, 72)), dtype=np.int64)


def _pgm(path, grey: np.ndarray, maxval: int) -> str:
    h, w = grey.shape
    path.write_bytes(b"P5\n%d %d\n%d\n" % (w, h, maxval) + grey.astype(">u2").tobytes())
    return str(path)


@pytest.mark.parametrize("maxval", [65535, 4095])
def test_a_16_bit_pgm_is_scaled_not_clipped_to_white(tmp_path, maxval):
    # PIL opens a PGM of maxval over 255 as mode I, format PPM: only a PNG's mode I was scaled, and
    # this one was clipped by PIL's RGB conversion to a white image, classified with no word.
    grey = _grey_photo()
    deep = _pgm(tmp_path / "deep.pgm", grey * maxval // 255, maxval)
    flat = tmp_path / "flat.pgm"
    Image.fromarray(grey.astype(np.uint8)).save(flat)
    decode = ic.get_decode_func("cpu", ic.EvalTransform(size=32))
    images, _ = decode([(deep, 0), (str(flat), 0)])
    assert images[0].float().mean() < 200 and (images[0].float() - images[1].float()).abs().mean() < 1.0


def test_parity_names_only_the_16_bit_grey_images_its_reference_clips(tmp_path):
    # A 32-bit float or int TIFF, converted alike on both sides, was said to be clipped by timm's
    # reference ("so that they differ there, not here"); a 16-bit PGM, which it clips, is named.
    grey = _grey_photo()
    Image.fromarray(grey.astype(np.float32)).save(tmp_path / "f.tif")
    Image.fromarray(grey.astype(np.int32)).save(tmp_path / "i.tif")
    deep = _pgm(tmp_path / "deep.pgm", grey * 257, 65535)
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    decode = ic.get_decode_func("cpu", model.transform, policy=ic.BadImagePolicy(skip=True))
    items = [(str(tmp_path / "f.tif"), 0), (str(tmp_path / "i.tif"), 0), (deep, 0)]
    parity = ic._measure_parity(items, decode, model)
    assert parity.images == 3 and parity.deep == [deep]


def test_the_machine_out_of_memory_in_a_decoder_is_no_bad_image():
    # FFmpeg's ENOMEM ("Cannot allocate memory") was an ImageDecodeError: with --skip-bad, good
    # images were counted as failed and the run exited 0; without it, "cannot decode" and --skip-bad.
    error = RuntimeError("Failed to parse the filter description: scale=224:224 (Cannot allocate memory)")
    assert isinstance(ic._undecodable("/data/a.JPEG", "FFmpeg", error), MemoryError)
    with pytest.raises(MemoryError, match="^PIL: "):
        with ic._pil_errors("/data/a.tif"):
            raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))
    corrupt = ic._undecodable("/data/a.JPEG", "FFmpeg", RuntimeError("Invalid data found when processing input"))
    assert isinstance(corrupt, ic.ImageDecodeError) and corrupt.reason.startswith("FFmpeg cannot decode it: Invalid")


def test_a_stage_failure_met_only_as_the_pipeline_stops_leaves_the_runs_own_stop(caplog):
    # The loop stopped on its own (a first bad image) while another thread's batch failed: SPDL's
    # stop() raised that failure, which replaced the run's outcome: no summary, no results file,
    # "unexpected PipelineFailure (a bug)".
    failing = threading.Event()

    def fails(items):
        failing.set()
        raise MemoryError("std::bad_alloc")

    pipeline = ic.get_pipeline([("a", 0), ("b", 0)], 1, fails, 1, 1, 1)
    pipeline.start()
    assert failing.wait(30)
    time.sleep(0.5)  # SPDL's stage takes the failure in
    with caplog.at_level("WARNING", logger="imagenet_classification"):
        assert ic._stop_pipeline(pipeline, False, False) is True
    assert "the loading pipeline also failed as it stopped: the loading pipeline failed: MemoryError" in caplog.text


def test_a_library_that_cannot_load_is_one_line_not_a_traceback():
    # Under a memory limit (ulimit -v, common under batch schedulers) torch's shared library cannot
    # be mapped: the command's only message was the import's traceback, exit 1.
    command = f"ulimit -v 500000; exec {shlex.quote(sys.executable)} {ROOT / 'imagenet_classification.py'} --help"
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: cannot load ") and proc.stderr.endswith(" (a memory limit: ulimit -v?)\n")


def test_a_wordnet_id_with_a_letter_after_it_does_not_stand_alone():
    # README: "the first WordNet ID standing alone (no letter or digit beside it)"; a letter after it
    # was taken (photos/n01440764b.JPEG: class 0, tench).
    with pytest.raises(ValueError, match="no WordNet ID"):
        ic.parse_wnid("photos/n01440764b.JPEG")
    assert ic.parse_wnid("photos/n01440764_b.JPEG") == "n01440764"


def test_an_empty_output_file_name_is_said_to_be_empty(capfd, tmp_path):
    # --results-file "" was "--results-file .: not a file name": Path("") is ".".
    proc = run_main(capfd, "--input-flist", tmp_path / "none.flist", "--results-file", "")
    assert proc.returncode == 2 and "argument --results-file: an empty file name (a variable not set?)" in proc.stderr


# --- A helper's reading of the GPU paths against torch's, torchvision's and SPDL's sources -----


@pytest.mark.parametrize(("width", "height", "on_the_device"), [(8000, 6000, True), (12100, 12100, False)])
def test_a_jpeg_too_large_for_the_devices_resize_goes_to_the_cpu(width, height, on_the_device):
    # torch's antialiased resize on CUDA refuses a shrink of over about 47 times (its filter weights
    # in 48 KiB of shared memory): a 12,100 x 12,100 JPEG (146 MP, within the pixel limit) went to the
    # GPU decoders, and its resize failed the run.
    header = ic._JpegHeader(0xC0, width, height, 3, b"\x22\x11\x11", 600)
    transform = ic.EvalTransform()
    assert ic._nvjpeg_takes(header, transform) is on_the_device
    assert ic._nvdec_can_take(header, transform) is on_the_device


# --- A helper's sweep of the advanced features --------------------------------------------------


def test_ranks_count_a_file_reached_by_two_names_once(tmp_path):
    # Under torchrun a file and a link to it (or a hard link) on two ranks' shards were two files:
    # the job's page-cache bytes doubled, and both ranks evicted it. One process counted it once.
    photo = tmp_path / "a.JPEG"
    photo.write_bytes(os.urandom(5000))
    (tmp_path / "soft.JPEG").symlink_to(photo)
    os.link(photo, tmp_path / "hard.JPEG")
    paths = [str(photo), str(tmp_path / "soft.JPEG"), str(tmp_path / "hard.JPEG"), str(tmp_path / "missing.JPEG")]
    listed = ic.ImageList(tuple(paths), (0,) * 4)  # rank 0: a, hard; rank 1: soft, missing
    elsewhere = [ic._listed_first_elsewhere(listed, ic._Shard(rank, 2)) for rank in (0, 1)]
    assert elsewhere == [set(), {paths[1]}]
    caches = [ic._examine_page_cache(listed.shard(r, 2).paths, False, elsewhere[r]) for r in (0, 1)]
    total = ic._PageCache.total(caches)
    assert (total.files, total.bytes, total.repeats) == (1, 5000, 2)


def test_a_flags_value_named_like_a_sweep_setting_is_no_stray_setting(tmp_path):
    # --results-file batch-size=4.json (a shell loop's name) was refused as "a --sweep setting after
    # another flag", with no --sweep given at all.
    parsed = ic._parse_args(["--input-flist", "l", "--results-file", "batch-size=4.json", "-b", "4"])
    assert str(parsed.results_file) == "batch-size=4.json"
    parsed = ic._parse_args(["--sweep", "auto", "--results-file", "batch-size=4.json", "/d"])
    assert (parsed.sweep, str(parsed.results_file)) == (["auto"], "batch-size=4.json")


def test_the_sweeps_command_keeps_its_settings_before_a_double_dash():
    # `--sweep num-threads=1 -- DIR`: the recommended line put --num-threads 1 after --, where the
    # parser takes it for DATA_DIR ("unrecognized arguments").
    point = ic._SweepPoint(num_threads=1, batch_size=4, queue_size=16, loader_fps=1.0, model_fps=1.0)
    typed = ["python", "x.py", "-b", "4", "--sweep", "num-threads=1", "--", "/d/val"]
    line = ic._with_settings(typed, point, ["--skip-bad"])
    assert line[-2:] == ["--", "/d/val"] and "--skip-bad" in line[: line.index("--")]
    assert ic._parse_args(line[2:]).num_threads == 1


def test_the_jobs_lead_is_each_timed_ranks_lead_summed_within_its_window():
    # make mutate's results group: once the lead was capped at the window, no test told `*` from `/`.
    cpu = torch.device("cpu")
    rank = ic.RunResult(listed=20, classified=10, frames_timed=10, elapsed_s=1.0, batches=10, batches_timed=10,
                        loader_lead=3)  # fmt: skip
    job = ic._job_total([ic._rank_share(rank, 0, cpu), ic._rank_share(rank, 1, cpu)], 20, rank)
    assert (job.batches_timed, job.loader_lead) == (20, 6)
