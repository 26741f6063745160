"""Hostile input, round twenty (2026-12-07). Each test fails on the code before it."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types

import pytest

import imagenet_classification as ic
from imagenet_classification import InputError
from tests.conftest import ROOT, TINY, make_jpeg_set, run_main
from tests.test_hostile18 import _spawned_workers


def test_the_results_dict_leaves_the_predictions_alone():
    # to_dict deep-copied every prediction row only to drop them: 0.9 s for 50,000 rows after the
    # run, and a row holding what cannot be copied (a lock a notebook put there) failed the result.
    rows = [{"path": "a.JPEG", "note": threading.Lock()}]
    result = ic.RunResult(listed=1, classified=1, top1_correct=1, top5_correct=1, predictions=rows)
    as_dict = result.to_dict()
    assert "predictions" not in as_dict and as_dict["classified"] == 1
    assert result.predictions is rows and rows[0]["path"] == "a.JPEG"


def test_a_flat_folder_is_not_said_to_hold_class_folders(tmp_path):
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "ILSVRC2012_val_00000001.JPEG").write_bytes(b"")
    none = r"class folders \(of which it has none; e\.g\. .*\); a flat folder needs labels"
    with pytest.raises(InputError, match=none):
        ic.scan_folder(tmp_path / "flat")
    (tmp_path / "flat" / "n01440764").mkdir()  # beside a class folder: said as before
    with pytest.raises(InputError, match=r"beside class folders \(e\.g\. ILSVRC2012_val_00000001\.JPEG\)"):
        ic.scan_folder(tmp_path / "flat")


def test_a_usage_error_into_a_full_disk_still_exits_2():
    # The usage could not be written to stderr: exit 1, a run's failure, where a script tells a usage error by 2.
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, str(ROOT / "imagenet_classification.py"), "--bogus"], stdout=full,
                              stderr=full, timeout=120)  # fmt: skip
    assert proc.returncode == 2


@pytest.mark.parametrize("loader", [["--loader", "torch"], ["--decode-processes", "1"], []])
def test_a_window_without_warm_up_opened_with_no_lead(jpeg_set, tmp_path, capfd, loader):
    # --warmup-batches 0: the window opens as the loader starts, yet its whole capacity (or the batches
    # "under way", just begun) was taken as a lead: "FPS may be up to 72% high", 0.72 in the results.
    out = tmp_path / "r.json"
    proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--no-compile",
                    "-b", "4", "--warmup-batches", "0", "--results-file", out, *loader)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert (result["loader_lead"], result["fps_max_overstatement"]) == (0, 0.0)
    assert "may have had" not in proc.stdout


def test_the_timelines_last_second_is_a_share_of_its_own_length():
    # A batch waited all the time, but the run's last 0.5 s was divided by a whole second: 50 %, and the
    # plot's "a batch waiting" line dropped at the end where nothing changed.
    stats = ic._PipelineStats()
    stats.queues.append(types.SimpleNamespace(changes=[(10.0, True)]))
    assert stats.waiting_per_interval(10.0, 11.5, 1.0, 2) == [1.0, 1.0]
    assert stats.waiting_per_interval(10.0, 11.5, 1.0, 3) == [1.0, 1.0, 0.0]  # a bin past the end: none
    stats.queues[-1].changes = [(10.0, False), (11.25, True)]
    assert stats.waiting_per_interval(10.0, 11.5, 1.0, 2) == [0.0, 0.5]


def test_no_sink_queue_verdict_over_a_window_that_holds_the_start_up():
    # 3 images, the warm-up included: the one batch waited for the pipeline to start, and the summary
    # said "loading is the bottleneck" beside --breakdown's "Bound ..., set by the model".
    stats = {"stages": [], "sink_queue": {"items": 1, "occupancy": 0.0, "ave_get_wait_s": 0.015}}
    result = ic.RunResult(listed=3, classified=3, frames_timed=3, elapsed_s=0.1, batches=1, warmup_included=True)
    out = io.StringIO()
    ic._print_report(ic._RunReport(result, {}, {}, [], pipeline_stats=stats), out)
    assert "SPDL sink queue: a batch was waiting 0% of the time" in out.getvalue()
    assert "bottleneck" not in out.getvalue() and "no verdict, the window holds the start-up" in out.getvalue()
    result.warmup_included = False
    out = io.StringIO()
    ic._print_report(ic._RunReport(result, {}, {}, [], pipeline_stats=stats), out)
    assert "loading is the bottleneck" in out.getvalue()


def test_a_file_just_over_the_size_limit_says_by_how_much(tmp_path):
    # "file of 1.0 MiB, over the 1 MiB limit": rounded onto the limit it is over.
    path = tmp_path / "a.JPEG"
    path.write_bytes(b"\xff" * (2**20 + 1))
    with pytest.raises(ic.ImageDecodeError, match=r"file of 1048577 bytes, over the 1 MiB limit \(1048576 bytes\)"):
        ic._read_image_bytes(str(path), 2**20)
    path.write_bytes(b"\xff" * (3 * 2**20))
    with pytest.raises(ic.ImageDecodeError, match=r"file of 3\.0 MiB, over the 1 MiB limit$"):
        ic._read_image_bytes(str(path), 2**20)


@pytest.mark.parametrize("sweep", [[], ["--sweep", "num-threads=1,2", "batch-size=2,4,8"]])
def test_a_signal_sent_twice_at_once_is_one(jpeg_set, tmp_path, sweep):
    # GNU timeout sends its signal to the process, then to its group: the repeat, taken for a second
    # signal, killed the process as it wrote its report. Every setting measured, or the partial
    # result, was lost with the results file, the summary cut off mid-line.
    flist = tmp_path / "many.flist"
    flist.write_text(jpeg_set.read_text() * 200)
    results = tmp_path / "r.json"
    cmd = [sys.executable, str(ROOT / "imagenet_classification.py"), "--input-flist", str(flist), "--prefix",
           f"{jpeg_set.parent}/", *TINY, "--no-compile", "-b", "2", "--results-file", str(results), *sweep]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # the loop under way
            if "Page cache:" in line or "Sweep:" in line:
                break
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)  # the first one handled: the repeat meets its handler
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-2000:]
    assert "interrupted by SIGTERM" in err and "Traceback" not in err
    assert results.exists() and out.endswith("\n"), out[-500:]


def test_a_ctrl_c_as_the_decode_processes_start_prints_no_python_warnings(tmp_path):
    # Stopped as its worker processes started, the run's last collection found the pipeline's coroutines
    # never started: 12 lines of "RuntimeWarning: coroutine '_sink' was never awaited" after the error.
    flist = make_jpeg_set(tmp_path, 40)
    cmd = [sys.executable, str(ROOT / "imagenet_classification.py"), "--input-flist", str(flist), "--prefix",
           f"{tmp_path}/", *TINY, "--no-compile", "-b", "4", "--decode-processes", "2"]  # fmt: skip
    cmd += ["--num-threads", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not _spawned_workers(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "error: interrupted by SIGINT" in err, err
    assert "Warning" not in err and "never awaited" not in err, err
