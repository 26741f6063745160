"""Hostile input, round nineteen (2026-12-07). Each test fails on the code before it."""

from __future__ import annotations

import copy
import io
import json
import multiprocessing
import os
import pickle
import pty
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest
import torch

import imagenet_classification as ic
from tests.conftest import ROOT, TINY, make_jpeg_set, write_jpeg

# --- Figures shown as they are: no rounding onto a value they are not ------------------------------------------


@pytest.mark.parametrize("elapsed", [0.0053116, 0.1449, 0.0421, 0.98, 1.0, 22.287])
def test_the_fps_lines_seconds_give_its_rate(elapsed):
    # "FPS=188.27 (1/0.01)": the seconds to two places, where the images over them gave 100.
    out = io.StringIO()
    ic._print_summary(ic.RunResult(listed=9, classified=9, frames_timed=7, elapsed_s=elapsed, batches=3), out)
    line = out.getvalue().splitlines()[0]
    fps, shown = line.removeprefix("FPS=").split(" (7/")
    assert fps == f"{7 / elapsed:.2f}"
    assert 7 / float(shown.removesuffix(")")) == pytest.approx(7 / elapsed, rel=0.005), line


@pytest.mark.parametrize(
    ("share", "places", "shown"),
    [(28_434_095 / 28_438_191, 1, ">99.9%"), (1.0, 1, "100.0%"), (0.0, 1, "0.0%"), (3e-5, 1, "<0.1%"),
     (0.996, 0, ">99%"), (1.004, 0, ">100%"), (0.9, 0, "90%"), (0.0625, 1, "6.2%"), (1.02, 0, "102%")],
)  # fmt: skip
def test_a_share_is_never_shown_as_all_or_none_that_is_not(share, places, shown):
    assert ic._percent(share, places) == shown


def test_accuracy_is_not_rounded_onto_100_in_the_summary_or_the_plots_title():
    # "Accuracy (top1)=100.00% (19999/20000)", and the plot's title "top-1 100.0%" for 1999 of 2000.
    out = io.StringIO()
    result = ic.RunResult(listed=20000, classified=20000, top1_correct=19999, top5_correct=20000, frames_timed=1,
                          elapsed_s=1.0, batches=2)  # fmt: skip
    ic._print_summary(result, out)
    assert "Accuracy (top1)=>99.99% (19999/20000)" in out.getvalue().splitlines()
    assert "Accuracy (top5)=100.00% (20000/20000)" in out.getvalue().splitlines()
    config = {"compile": None, "num_threads": 2, "loader": "spdl", "decode_processes": 0, "batch_size": 4,
              "decoder": "ffmpeg", "model": "m", "device": "cpu", "dtype": "float32"}  # fmt: skip
    result = ic.RunResult(listed=2000, classified=2000, top1_correct=1999, frames_timed=8, elapsed_s=1.0)
    assert "top-1 >99.9% of 2000" in ic._run_title(ic._RunReport(result, config, {}, [{"rank": 0}]))


def test_the_page_cache_line_does_not_say_all_in_memory_when_a_page_is_not():
    # One page of 28 MB out of memory: "100.0% of the listed 28.4 MB was in memory".
    cache = ic._PageCache(True, files=1, bytes=28_438_191, resident_bytes=28_434_095, resident_after_bytes=4096)
    line = ic._page_cache_lines(cache)[0]
    assert "before it, >99.9% of the listed 28.4 MB was in memory, <0.1% after eviction" in line, line
    whole = ic._PageCache(False, files=1, bytes=1000, resident_bytes=1000)
    assert "before it, 100.0% of the listed" in ic._page_cache_lines(whole)[0]


def test_the_breakdowns_efficiency_is_not_rounded_onto_100():
    # 99.6 % of the bound was "reaches 100% of it"; 100.4 % "reaches 100% of it (above 100 %: ...)".
    for e2e, shown in ((39.84, ">99%"), (40.16, ">100%")):
        out = io.StringIO()
        ic._print_breakdown(ic._Breakdown.from_rates(40.0, 600.0, e2e, torch.device("cuda", 0)), out)
        assert f"end-to-end reaches {shown} of it" in out.getvalue(), out.getvalue()


# --- The plot under torchrun: its dashed line is rank 0's rate ---------------------------------------------------

_LEGEND = """
import json, sys
from pathlib import Path
import imagenet_classification as ic

def save(fig, ax, path):  # the legend's words, where the PNG would be
    Path(path).write_text(json.dumps([t.get_text() for t in ax.get_legend().get_texts()]))

ic._save = save
ic.entrypoint(sys.argv[1:])
"""


def test_a_jobs_plot_labels_its_dashed_rate_as_rank_0s(jpeg_set, tmp_path):
    # The title gave the job's FPS (447.0) and the legend "FPS window: 227.4 images/s", rank 0's.
    script = tmp_path / "legend.py"
    script.write_text(textwrap.dedent(_LEGEND))
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    args = ["--input-flist", str(jpeg_set), "--prefix", f"{jpeg_set.parent}/", *TINY, "--num-threads", "1",
            "--no-compile", "--no-bf16", "--batch-size", "3", "--warmup-batches", "1"]  # fmt: skip
    plot, results = tmp_path / "t.png", tmp_path / "r.json"
    proc = subprocess.run([*launcher, str(script), *args, "--plot", str(plot), "--results-file", str(results)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    labels = json.loads(plot.read_text())
    rank0 = json.loads(results.read_text())["ranks"][0]["fps"]
    assert f"rank 0's window: {rank0:,.1f} images/s" in labels, labels
    assert not any(label.startswith("FPS window") for label in labels)


# --- --decode-processes workers that end: a script without a main guard, a worker that exits -------------------


def test_a_script_without_a_main_guard_says_so_at_once(tmp_path):
    # Each spawned worker ran the script again, so main() again; the run waited out --timeout (124 s),
    # then blamed the out-of-memory killer.
    script = tmp_path / "unguarded.py"
    args = ["--input-flist", "LIST", "--prefix", "PREFIX", *TINY, "--batch-size", "8", "--decode-processes", "2"]
    script.write_text(f"import imagenet_classification as ic\nic.main({[*args, '--timeout', '90']!r})\n")
    jpegs = make_jpeg_set(tmp_path / "jpegs", 16)
    text = script.read_text().replace("'LIST'", repr(str(jpegs))).replace("'PREFIX'", repr(f"{jpegs.parent}/"))
    script.write_text(text)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert time.monotonic() - started < 60, proc.stderr[-2000:]  # not the 90 s time-out
    guard = "main() was called as a worker process started: each runs the main script again, whose top level calls "
    assert guard + 'main(); call it under `if __name__ == "__main__":`' in proc.stderr
    said = r"error: the loading pipeline failed: a --decode-processes worker died \([12] of 2 gone, exit status 1; "
    assert re.search(said + r"its error is above\)$", proc.stderr, re.M), proc.stderr[-2000:]  # 1: the other not yet
    assert "Images: listed=16 classified=0 failed=0 not_reached=16 (PARTIAL RUN)" in proc.stdout


class _NoBatch:
    """SPDL's iterator while no batch comes: each wait ends in its time-out."""

    def __iter__(self):
        return self

    def __next__(self):
        time.sleep(0.05)
        raise TimeoutError


@pytest.mark.parametrize(
    ("target", "args", "said"),
    [(os._exit, (3,), "(1 of 1 gone, exit status 3; its error is above)"),
     (time.sleep, (60,), "(1 of 1 gone, killed by signal 9 (Killed)): killed, by the out-of-memory killer?")],
)  # fmt: skip
def test_a_worker_that_ends_stops_the_wait_at_once(target, args, said):
    worker = multiprocessing.get_context("spawn").Process(target=target, args=args)
    worker.start()
    try:
        if target is time.sleep:
            os.kill(worker.pid, signal.SIGKILL)
        worker.join(30)
        started = time.monotonic()
        with pytest.raises(ic.RunStopped) as stopped:
            next(ic._ending_once_complete(_NoBatch(), 1, [worker], timeout=60.0))
        assert time.monotonic() - started < 10 and stopped.value.kind == "loader"
        assert str(stopped.value).startswith(f"the loading pipeline failed: a --decode-processes worker died {said}")
        assert ("out-of-memory" in str(stopped.value)) is (target is time.sleep)
    finally:
        worker.kill()
        worker.join()


def test_a_worker_that_ended_cleanly_leaves_the_wait_to_its_time_out():
    worker = multiprocessing.get_context("spawn").Process(target=os._exit, args=(0,))
    worker.start()
    worker.join(30)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        next(ic._ending_once_complete(_NoBatch(), 1, [worker], timeout=0.5))
    assert time.monotonic() - started >= 0.5


# --- A stopped run's exception travels: pickled (a process pool), copied ------------------------------------------


def test_a_stopped_or_interrupted_run_pickles_with_its_partial_result():
    # RunStopped's pickle called __init__(message) (kind missing): a run in a ProcessPoolExecutor
    # that stopped broke the pool, and in multiprocessing.Pool the result thread died and get() hung.
    result = ic.RunResult(listed=8, classified=3, failed=1, partial=True)
    stopped = ic.RunStopped("no batch within 5 s", "stalled", advice="raise --timeout", where="decoding x.JPEG")
    stopped.result = result
    interrupted = ic.RunInterrupted(signal.SIGTERM, result)
    for error in (stopped, interrupted):
        for again in (pickle.loads(pickle.dumps(error)), copy.copy(error)):
            assert type(again) is type(error) and str(again) == str(error)
            assert again.__dict__.keys() == error.__dict__.keys()
            assert again.result.to_dict() == result.to_dict()
    again = pickle.loads(pickle.dumps(stopped))
    assert (again.kind, again.advice, again.where) == ("stalled", "raise --timeout", "decoding x.JPEG")
    assert pickle.loads(pickle.dumps(interrupted)).signum == signal.SIGTERM


# --- Batches of another shape: refused before they are counted ---------------------------------------------------


def _uint8(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.uint8)


@pytest.mark.parametrize(
    ("images", "said"),
    [(_uint8(3, 64, 64), "images of shape (3, 64, 64): expected N x 3 x H x W"),
     (_uint8(64 * 64 * 3), "images of shape (12288,): expected N x 3 x H x W"),
     (_uint8(2, 64, 64, 3), "images of shape (2, 64, 64, 3): expected N x 3 x H x W")],
)  # fmt: skip
def test_the_loader_alone_refuses_images_it_would_miscount(images, said):
    # An unbatched loader (3 x H x W each) of 40 images/s measured 116: the channels counted as images.
    batches = [(images, torch.zeros(1, dtype=torch.int64))] * 3
    with pytest.raises(ValueError, match=re.escape(said)):
        ic.measure_loader(batches, "cpu", warmup_batches=1)
    with pytest.warns(ic.WarmupIncluded):  # empty batches (every image failed), of any shape: none counted
        assert ic.measure_loader([(_uint8(0), torch.zeros(0))] * 2, "cpu", warmup_batches=1) == 0.0


@pytest.mark.parametrize(
    ("images", "labels", "said"),
    [(_uint8(3, 32, 32), torch.tensor(5), "images of shape (3, 32, 32): expected N x 3 x H x W"),
     (_uint8(2, 32, 32, 3), torch.zeros(2, dtype=torch.int64), "images of shape (2, 32, 32, 3): expected N x 3"),
     (_uint8(1, 3, 32, 32), torch.tensor(5), "labels of shape () for 1 image: expected 1 x 1 (or 1)")],
)  # fmt: skip
def test_a_run_names_a_batch_of_the_wrong_shape_before_anything_else(images, labels, said):
    # A 0-d label: "TypeError: len() of a 0-d tensor"; N x H x W x 3 first warned "images of 3 x 32 for
    # a model whose transform crops 32 x 32", which was not the fault.
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning first
        with pytest.raises(ValueError, match=re.escape(said)):
            ic.benchmark([(images, labels)], model, listed=1, warmup_batches=0)


def test_progress_gets_the_top1_count_of_its_batch_not_the_running_tally():
    # progress was given the run's own tally tensor: a history kept without a sync read the final
    # count at every step, and a callback that changed it in place changed the result.
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    size = model.transform.size
    images = torch.randint(0, 256, (4, 3, size, size), dtype=torch.uint8)
    with torch.inference_mode():
        top = model.logits(images).argmax(dim=-1)
    labels = [top.view(-1, 1), torch.full((4, 1), -1), top.view(-1, 1)]  # 4 hits, none, 4 hits
    seen = []

    def progress(classified, top1):
        seen.append((classified, top1))
        top1.zero_()  # the callback's own tensor

    result = ic.benchmark([(images, label) for label in labels], model, listed=12, warmup_batches=1, progress=progress)
    assert result.top1_correct == 8
    assert [(n, int(t)) for n, t in seen] == [(4, 0), (8, 0), (12, 0)]  # zeroed: each its own
    seen.clear()
    result = ic.benchmark([(images, label) for label in labels], model, listed=12, warmup_batches=1,
                          progress=lambda n, top1: seen.append((n, top1)))  # fmt: skip
    assert [(n, int(t)) for n, t in seen] == [(4, 4), (8, 4), (12, 8)]


# --- A notebook's own items and decode functions: bad images stay bad images -----------------------------------


@pytest.mark.parametrize("odd", ["x\0y.JPEG", "x\ud800y.JPEG"])
def test_a_path_no_file_can_have_is_a_counted_bad_image(tmp_path, odd):
    # ImageList takes it; os.open raised "ValueError: embedded null byte" naming no image, and a
    # skipping run stopped on it as the pipeline's failure.
    good = str(write_jpeg(tmp_path / "good.JPEG", (96, 80), (20, 200, 40)))
    decode = ic.get_decode_func("cpu", ic.EvalTransform(size=32), policy=ic.BadImagePolicy(skip=True))
    batch = decode([(good, 1), (str(tmp_path / odd), 2), (good, 3)])
    assert batch[1].view(-1).tolist() == [1, 3] and [f.path for f in batch.failures] == [str(tmp_path / odd)]
    assert batch.failures[0].reason.startswith("no file can have this name (")


def test_paths_given_as_path_or_bytes_come_back_as_str(tmp_path):
    # A Path or bytes item was kept as given: json.dumps(result.to_dict()) raised TypeError at the end.
    good = write_jpeg(tmp_path / "good.JPEG", (96, 80), (20, 200, 40))
    (tmp_path / "bad.JPEG").write_bytes(b"not a JPEG")
    decode = ic.get_decode_func("cpu", ic.EvalTransform(size=32), policy=ic.BadImagePolicy(skip=True))
    batch = decode([(good, 1), (os.fsencode(good), 2), (tmp_path / "bad.JPEG", 3)])
    assert batch.paths == (str(good), str(good)) and batch.failures[0].path == str(tmp_path / "bad.JPEG")
    json.dumps({"paths": batch.paths, "failures": [f.path for f in batch.failures]})


def test_a_decode_function_without_the_policy_stops_as_a_bad_image_and_says_why(tmp_path):
    # The policy given to benchmark, not to get_decode_func: the first bad image failed the pipeline,
    # and the run stopped as the loader's failure (kind "loader") after SPDL's tracebacks.
    good = str(write_jpeg(tmp_path / "good.JPEG", (96, 80), (20, 200, 40)))
    (tmp_path / "bad.JPEG").write_bytes(b"not a JPEG")
    items = [(good, 1), (good, 2), (str(tmp_path / "bad.JPEG"), 3), (good, 4)]
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    pipeline = ic.get_pipeline(items, 2, ic.get_decode_func("cpu", model.transform), 1, 2, 1)
    with pipeline.auto_stop(), pytest.raises(ic.RunStopped) as stopped:
        ic.benchmark(pipeline.get_iterator(timeout=60), model, listed=4, policy=ic.BadImagePolicy(skip=True))
    assert (
        stopped.value.kind == "bad_image"
        and str(stopped.value)
        == f"cannot decode {tmp_path}/bad.JPEG: " + "not an image: its data is no format PIL or FFmpeg is used for"
    )
    assert stopped.value.advice.startswith("give get_decode_func the policy given to benchmark")
    assert stopped.value.result.classified + stopped.value.result.failed <= 4


# --- Lists read from a terminal or a notebook's own standard input ------------------------------------------------


def test_a_list_named_by_a_terminals_path_is_refused_not_waited_for():
    # "-" on a terminal was refused; /dev/stdin, /dev/tty or the terminal's own name waited for typing.
    main, terminal = pty.openpty()
    outcome = []

    def read() -> None:
        try:
            ic.read_file_list(os.ttyname(terminal))
        except ic.InputError as e:
            outcome.append(str(e))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(30)
    try:
        assert outcome == [f"{os.ttyname(terminal)}: is a terminal; pipe the list in (--input-flist - < FILE, or "
                           "find ... | ...)"]  # fmt: skip
    finally:
        os.close(main)
        os.close(terminal)


def test_a_notebooks_own_text_stdin_is_read(monkeypatch, tmp_path):
    # io.StringIO has no .buffer: AttributeError from read_file_list("-") and read_labels("-").
    monkeypatch.setattr(sys, "stdin", io.StringIO("a/n01440764/x.JPEG\nb/n01443537/y.JPEG\n"))
    images = ic.read_file_list("-", prefix="/data/")
    assert images.paths == ("/data/a/n01440764/x.JPEG", "/data/b/n01443537/y.JPEG") and images.labels == (0, 1)
    monkeypatch.setattr(sys, "stdin", io.StringIO("x n01443537\ny 7\n"))
    assert dict(ic.read_labels("-")) == {"x": 1, "y": 7}


@pytest.mark.parametrize(
    ("overrides", "said"),
    [({"input_size": (3, 200.7, 200.7)}, "{'input_size': (3, 200.7, 200.7)}: expected (3, height, width) in pixels"),
     ({"input_size": (1, 224, 224)}, "{'input_size': (1, 224, 224)}: expected (3, height, width) in pixels"),
     ({"img_size": 96.5}, "{'img_size': 96.5}: expected a whole number of pixels"),
     ({"crop_pct": "0.9"}, "{'crop_pct': '0.9'}: expected a number")],
)  # fmt: skip
def test_transform_overrides_are_not_coerced(overrides, said):
    # A crop of 200.7 became 200, one channel was ignored, crop_pct "0.9" was taken: while
    # img_size=np.int64(224) was refused as "not values timm takes".
    with pytest.raises(ValueError, match=re.escape(f"transform overrides {said}")):
        ic.EvalTransform.from_model("test_efficientnet", overrides)


def test_numpy_sizes_are_taken_as_sizes():
    import numpy as np

    assert ic.EvalTransform.from_model("test_efficientnet", {"img_size": np.int64(96)}).size == 96
    shape = (np.int64(3), np.int32(80), np.int64(80))
    assert ic.EvalTransform.from_model("test_efficientnet", {"input_size": shape, "crop_pct": None}).size == 80


_BACKEND = """
import matplotlib.pyplot as plt
import imagenet_classification as ic

plt.switch_backend("svg")  # a notebook's own (inline), with a figure of its own open
plt.figure()
timeline = {"batch_end_s": [0.5, 1.0, 1.5], "batch_images": [4, 4, 4], "warmup_end_s": 0.5, "window_end_s": 1.5,
            "end_s": 1.6, "interval_s": 1.0, "sink_occupancy": [0.5, 1.0]}
drawn = ic._plot_timeline(timeline, "t.png")
points = [ic._SweepPoint(t, 8, 2, 100.0 * t, 900.0) for t in (1, 2)]
drawn &= ic._plot_sweep(ic._Sweep(points, 40), "s.png", "a sweep")
print(drawn, plt.get_backend(), plt.get_fignums())
"""


def test_plots_leave_a_notebooks_matplotlib_as_it_was(tmp_path):
    # main() switched pyplot's backend to Agg for good (a notebook's inline plots no longer showed),
    # with --plot, and with --sweep without it.
    proc = subprocess.run([sys.executable, "-c", _BACKEND], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "True svg [1]"
    assert (tmp_path / "t.png").read_bytes()[:4] == (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


# --- A notebook's own loader and callback: their errors are theirs -------------------------------------------------


def _batches(count: int, error: BaseException | None = None):
    for _ in range(count):
        yield _uint8(4, 3, 32, 32), torch.zeros(4, dtype=torch.int64)
    if error is not None:
        raise error


@pytest.fixture(scope="module")
def tiny_bundle():
    return ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False, transform={"img_size": 32})


def test_a_loaders_own_time_out_is_said_in_its_own_words(tiny_bundle):
    # A socket's TimeoutError (S3, NFS) was "no batch within the loader's time-out: the decode stage is
    # decoding no image", its own text lost; a progress callback's, the same.
    with pytest.raises(ic.RunStopped) as stopped:
        ic.benchmark(_batches(2, TimeoutError("S3 GetObject read timed out")), tiny_bundle, listed=12)
    assert (stopped.value.kind, str(stopped.value)) == ("stalled", "the loader timed out: TimeoutError: S3 GetObject "
                                                        "read timed out")  # fmt: skip
    assert stopped.value.result.classified == 8 and stopped.value.result.not_reached == 4

    def progress(classified, top1):
        raise TimeoutError("my dashboard's post timed out")

    with pytest.raises(TimeoutError, match="my dashboard's post timed out"):  # the callback's own error, as any
        ic.benchmark(_batches(2), tiny_bundle, listed=8, progress=progress)


class _FailingDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise OSError(5, "Input/output error", "/mnt/nfs/val/img_5.JPEG")
        return _uint8(3, 32, 32), 0


def test_a_dataloader_workers_error_is_said_by_its_own_words(tiny_bundle):
    # "the loader failed: OSError: Caught OSError in DataLoader worker process 0.": the reason was in
    # torch's text, past its first line.
    loader = torch.utils.data.DataLoader(_FailingDataset(), batch_size=4, num_workers=1)
    with pytest.raises(ic.RunStopped) as stopped:
        ic.benchmark(loader, tiny_bundle, listed=8, warmup_batches=0)
    assert str(stopped.value) == ("the loader failed: OSError: [Errno 5] Input/output error: '/mnt/nfs/val/img_5.JPEG' "
                                  "(OSError: Caught OSError in DataLoader worker process 0)")  # fmt: skip
    assert stopped.value.result.classified == 4


def test_the_loader_alone_stops_on_a_loaders_error_as_a_run_does():
    # measure_loader let the loader's OSError out raw, though it says it raises RunStopped as benchmark.
    failure = OSError(5, "Input/output error", "/mnt/nfs/val/x.JPEG")
    with pytest.raises(ic.RunStopped) as stopped:
        ic.measure_loader(_batches(3, failure), "cpu", warmup_batches=1)
    assert stopped.value.kind == "loader" and str(stopped.value).startswith("the loader failed: OSError: [Errno 5]")


# --- Labels by name: a dot in a name is no extension ---------------------------------------------------------------


def test_labels_match_names_that_hold_a_dot_without_cutting_them(tmp_path):
    # "cat.v1" was keyed "cat": cat.v1.JPEG had "no label", and the label of "cat.2024" was given to
    # cat.JPEG without a word (a cat scored as an espresso).
    labels = tmp_path / "labels.txt"
    labels.write_text("cat.v1 n02123045\ncup.v2.JPEG n07920052\ncat.2024 n07920052\nILSVRC2012_val_01 7\n")
    named = ic.read_labels(labels)
    assert dict(named) == {"cat.v1": 281, "cup.v2": 967, "cat.2024": 967, "ILSVRC2012_val_01": 7}
    flist = tmp_path / "list.txt"
    flist.write_text("a/cat.v1.JPEG\na/cup.v2.png\nb/ILSVRC2012_val_01.jpeg\n")
    assert ic.read_file_list(flist, labels=named).labels == (281, 967, 7)
    flist.write_text("a/cat.JPEG\n")
    with pytest.raises(ic.InputError, match=re.escape(f"{flist}:1: {labels} has no label for 'cat'")):
        ic.read_file_list(flist, labels=named)


def test_the_bundle_called_by_hand_refuses_training_mode_and_builds_no_graph(tiny_bundle):
    # benchmark refused a model in training mode; the bundle's own call ran it, and its batch norm
    # rewrote its running statistics for good. Called by hand, it also built an autograd graph.
    images = _uint8(4, 3, 32, 32) + 100
    before = tiny_bundle.logits(images)
    assert not before.requires_grad
    tiny_bundle.train()
    try:
        for call in (lambda: tiny_bundle.logits(images), lambda: tiny_bundle(images, torch.zeros(4, 1).long())):
            with pytest.raises(ValueError, match="the model is in training mode"):
                call()
    finally:
        tiny_bundle.eval()
    assert torch.equal(tiny_bundle.logits(images), before)


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_help_or_version_into_a_full_disk_is_no_success(flag):
    # argparse drops the OSError: exit 0 with nothing written, where a run's summary says so.
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, str(ROOT / "imagenet_classification.py"), flag], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and proc.stderr == "error: the text could not be written (No space left on device)\n"
    piped = subprocess.run(f"{sys.executable} {ROOT / 'imagenet_classification.py'} {flag} | head -c 1", shell=True,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert piped.stderr == ""  # a reader that stops is no failure


_STATE = """
import logging, sys
import imagenet_classification as ic

if __name__ == "__main__":
    sys.stdout.reconfigure(errors="strict")
    sys.stderr.reconfigure(errors="replace")
    hub = logging.getLogger("huggingface_hub")
    ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    after_get_model = hub.propagate
    status = ic.main(sys.argv[1:])
    print(status, after_get_model, hub.propagate, sys.stdout.errors, sys.stderr.errors)
"""


def test_main_and_get_model_leave_the_callers_state_as_it_was(jpeg_set, tmp_path):
    # main() left stdout and stderr escaping (backslashreplace), get_model() the hub's logger not
    # propagating; a script that called main() printed nanobind's "leaked" lines at its exit.
    script = tmp_path / "state.py"
    script.write_text(_STATE)
    args = ["--input-flist", str(jpeg_set), "--prefix", f"{jpeg_set.parent}/", *TINY, "--no-compile", "-b", "8"]
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "0 True True strict replace"
    assert "leaked" not in proc.stderr, proc.stderr[-2000:]


def test_get_model_refuses_an_empty_compile_mode_or_checkpoint_path():
    # compile="" meant no compile without a word; checkpoint="" was ".: cannot load checkpoint".
    with pytest.raises(ValueError, match=r"^compile='': True, False or one of"):
        ic.get_model("test_efficientnet", "cpu", pretrained=False, compile="")
    with pytest.raises(ValueError, match=r"^checkpoint='': expected a checkpoint file's path, or None"):
        ic.get_model("test_efficientnet", "cpu", checkpoint="")


def test_a_plot_inside_the_scanned_folder_is_refused(tmp_path):
    # --plot DIR/n02123045/timeline.png: the next run with the same flags listed 41 of 40 photos, the
    # PNG classified as a tabby cat. A results file there is no image: written as asked.
    data = tmp_path / "val"
    write_jpeg(data / "n02123045" / "cat.JPEG", (64, 48), (90, 90, 90))
    plot = data / "n02123045" / "timeline.png"
    args = [str(data), *TINY, "--no-compile", "-b", "1", "--results-file", str(data / "r.json"), "--plot", str(plot)]
    proc = subprocess.run([sys.executable, str(ROOT / "imagenet_classification.py"), *args], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert (
        f"error: --plot {data}/n02123045/timeline.png: that is inside --data-dir {data}, whose next scan would "
        "count it" in proc.stderr.splitlines()
    )
