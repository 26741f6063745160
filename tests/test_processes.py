"""--decode-processes: the decode stage in SPDL's worker processes (issue #22), on the CPU."""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import imagenet_classification as ic
from imagenet_classification import _parse_sweep
from tests.conftest import ROOT, TINY, make_jpeg_set, read_json, run_cli, run_main


def _photos_with_a_bad_one(demo_photos: Path, root: Path) -> tuple[Path, Path]:
    """A private copy of 15 demo photos and one cut JPEG among them (the 6th listed)."""
    shutil.copytree(demo_photos.parent / "val", root / "val")
    lines = demo_photos.read_text().splitlines()[:15]
    bad = root / Path(lines[0]).with_name("cut.JPEG")
    bad.write_bytes((root / lines[0]).read_bytes()[:3000])  # no end-of-image marker: always a bad image
    lines.insert(5, str(bad.relative_to(root)))
    flist = root / "photos.flist"
    flist.write_text("\n".join(lines) + "\n")
    return flist, bad


def _run(flist: Path, checkpoint: Path, out: Path, processes: int, threads: int) -> tuple[dict, list[dict]]:
    proc = run_cli("--input-flist", flist, "--prefix", f"{flist.parent}/", "--model", "efficientnet_lite0",
                   "--checkpoint", checkpoint, "--device", "cpu", "--no-compile", "--dtype", "float32",
                   "--batch-size", "4", "--warmup-batches", "1", "--skip-bad", "--num-threads", str(threads),
                   "--decode-processes", str(processes), "--results-file", out.with_suffix(".json"),
                   "--predictions-file", out.with_suffix(".csv"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "leaked" not in proc.stderr, proc.stderr[-3000:]
    with open(out.with_suffix(".csv"), newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda row: row["path"])  # workers deliver in any order
    return read_json(out.with_suffix(".json")), rows


def test_processes_and_threads_give_the_same_counts_accuracy_and_predictions(demo_photos, lite0_checkpoint,
                                                                            tmp_path):  # fmt: skip
    flist, bad = _photos_with_a_bad_one(demo_photos, tmp_path)
    runs = {(p, t): _run(flist, lite0_checkpoint, tmp_path / f"{p}x{t}", p, t) for p, t in ((0, 2), (1, 2), (2, 1))}
    for (processes, threads), (result, rows) in runs.items():
        assert result["config"]["decode_processes"] == processes and result["config"]["num_threads"] == threads
        assert (result["listed"], result["classified"], result["failed"], result["not_reached"]) == (16, 15, 1, 0)
        # The cut image counted once across the workers, with the reason the in-process loader gives.
        assert [f["path"] for f in result["failures"]] == [str(bad)]
        assert "truncated JPEG" in result["failures"][0]["reason"]
        assert len(rows) == 15 and str(bad) not in {row["path"] for row in rows}
        assert 0 <= result["drained_batches"] <= result["batches_timed"]  # the loader's end seen in both
    reference, reference_rows = runs[(0, 2)]
    assert reference["top1_correct"] >= 10  # real weights on real photos: a comparison worth making
    for key in ((1, 2), (2, 1)):
        result, rows = runs[key]
        assert (result["top1_correct"], result["top5_correct"]) == (reference["top1_correct"],
                                                                    reference["top5_correct"])  # fmt: skip
        assert rows == reference_rows  # the same pixels, so the same classes and probabilities


def _worker_pids(pid: int) -> set[int]:
    """The decode workers among a process's children (not multiprocessing's resource tracker)."""
    found = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"spawn_main" in cmdline:
                found.add(int(child))
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start_in_two_processes(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    """A run over 6000 images (far more than a test waits for) in 2 decode processes; its results file."""
    flist = make_jpeg_set(tmp_path, 40)
    flist.write_text("\n".join(flist.read_text().splitlines() * 150) + "\n")
    out = tmp_path / "r.json"
    cmd = [sys.executable, str(ROOT / "imagenet_classification.py"), "--input-flist", str(flist), "--prefix",
           f"{flist.parent}/", *TINY, "--no-compile", "--batch-size", "4", "--warmup-batches", "1",
           "--decode-processes", "2", "--num-threads", "1", "--results-file", str(out), *extra]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True), out


# SIGTERM to the main process; a hang-up (a closed terminal) to the whole process group, workers too.
@pytest.mark.parametrize("signum, group", [(signal.SIGTERM, False), (signal.SIGHUP, True)], ids=["term", "hangup"])
def test_a_signal_stops_every_decode_process_and_keeps_the_partial_result(tmp_path, signum, group):
    proc, out = _start_in_two_processes(tmp_path)
    deadline = time.monotonic() + 120
    while len(workers := _worker_pids(proc.pid)) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "the decode workers did not start"
        time.sleep(0.2)
    time.sleep(5)  # the workers decoding
    sent = time.monotonic()
    if group:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signum and time.monotonic() - sent < 2.0, stderr[-2000:]
    while any(_running(pid) for pid in workers) and time.monotonic() - sent < 2.0:
        time.sleep(0.05)
    assert not any(_running(pid) for pid in workers), "a decode worker outlived the run by 2 s"
    assert f"interrupted by {signum.name}" in stderr and "(PARTIAL RUN)" in stdout and "Traceback" not in stderr
    assert "leaked semaphore" not in stderr, stderr[-2000:]  # the tracker removes them: no warning about it
    assert "SPDL stages: none timed in this process (the decode stage runs in worker processes)" in stdout
    result = read_json(out)
    assert result["partial"] is True and result["listed"] == 6000
    assert result["classified"] + result["failed"] + result["not_reached"] == 6000


def test_decode_processes_are_for_ffmpeg_only(jpeg_set, capfd):
    for flag in ("--use-nvjpeg", "--loader=torch"):
        proc = run_cli("--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--decode-processes", "2",
                       flag)  # fmt: skip
        assert proc.returncode == 2 and "--decode-processes" in proc.stderr, proc.stderr[-1000:]
        # A sweep's setting too: it would time the DataLoader (or the GPU decoder) as "2 processes".
        proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, flag,
                        "--sweep", "decode-processes=0,2")  # fmt: skip
        assert proc.returncode == 2 and "error: --sweep decode-processes=... runs FFmpeg's decode" in proc.stderr


def test_worker_processes_are_capped_at_the_batches(jpeg_set, caplog):
    # 30 images in batches of 16: 2 batches, so 2 worker processes at most (each an interpreter).
    caplog.set_level("INFO", logger=ic.__name__)
    args = ["--input-flist", str(jpeg_set), "--prefix", f"{jpeg_set.parent}/", *TINY, "--batch-size", "16"]
    config = ic._preflight(ic._parse_args([*args, "--decode-processes", "12"]), ic._Shard())
    assert config.decode_processes == 2
    assert "--decode-processes 12 capped at 2, the batches this process has." in caplog.text
    assert ic._preflight(ic._parse_args([*args, "--decode-processes", "2"]), ic._Shard()).decode_processes == 2
    sweep = ic._preflight(ic._parse_args([*args, "--sweep", "decode-processes=0,1,8"]), ic._Shard()).sweep
    assert sweep["decode-processes"] == [0, 1, 2]


def test_the_sweep_learns_processes(jpeg_set, tmp_path):
    defaults = {"num-threads": 2, "batch-size": 32, "queue-size": 16, "decode-processes": 0}
    assert _parse_sweep(["decode-processes=4,1,2,0"], defaults, 2)["decode-processes"] == [0, 1, 2, 4]
    with pytest.raises(ValueError, match="at least 0"):
        _parse_sweep(["decode-processes=-1"], defaults, 2)
    out = tmp_path / "sweep.json"
    proc = run_cli("--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--no-compile", "--dtype",
                   "float32", "--batch-size", "4", "--sweep", "num-threads=1", "decode-processes=0,2",
                   "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    points = read_json(out)["sweep"]["points"]
    assert [(p["decode_processes"], p["num_threads"]) for p in points] == [(0, 1), (2, 1)]
    assert all(p["loader_fps"] > 0 for p in points)
    assert "processes  threads  batch" in proc.stdout
    best = read_json(out)["sweep"]["recommended"]
    assert proc.stdout.strip().endswith("--decode-processes 2" if best["decode_processes"] else "--queue-size 16")


def test_a_stall_names_the_worker_processes(jpeg_set):
    # A time-out far shorter than a spawned worker takes to start (it imports torch): no batch in time.
    proc = run_cli("--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--no-compile",
                   "--decode-processes", "1", "--timeout", "0.2")  # fmt: skip
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "the decode stage has been on a batch in a --decode-processes worker for" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_decode_worker_killed_stops_the_run_with_one_line_that_says_so(tmp_path):
    # The out-of-memory killer ends a worker: one line says a worker died (SPDL's own is 'pipeline
    # stages failed'), with the partial result, every listed image accounted for.
    proc, out = _start_in_two_processes(tmp_path)
    deadline = time.monotonic() + 120
    loaded = False  # a worker killed as it starts is another case: SPDL waits for it (until --timeout)
    while not loaded:
        assert proc.poll() is None and time.monotonic() < deadline, "the decode workers did not start"
        time.sleep(0.2)
        workers = _worker_pids(proc.pid)
        with contextlib.suppress(OSError):  # FFmpeg's libraries, loaded by the worker's initializer
            loaded = len(workers) == 2 and all(b"libavcodec" in Path(f"/proc/{w}/maps").read_bytes() for w in workers)
    time.sleep(3)  # the workers decoding
    os.kill(min(workers), signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=60)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1, stderr[-3000:]
    assert errors[0].startswith("error: the loading pipeline failed: a --decode-processes worker died (")
    assert "Traceback" not in stderr, stderr[-3000:]  # SPDL's, 150 lines of them, before that one line
    assert "(PARTIAL RUN)" in stdout
    result = read_json(out)
    assert result["partial"] is True and result["classified"] + result["not_reached"] == 6000


def test_a_decode_worker_killed_as_it_starts_is_named_at_the_time_out(tmp_path):
    # SPDL waits for the batches of a worker killed before it has started: at the time-out, the run
    # says a worker died (exit 1), not that the decode stage stalled (exit 3).
    proc, out = _start_in_two_processes(tmp_path, "--timeout", "5")
    deadline = time.monotonic() + 120
    while not (workers := _worker_pids(proc.pid)):
        assert proc.poll() is None and time.monotonic() < deadline, "no decode worker started"
        time.sleep(0.02)
    os.kill(min(workers), signal.SIGKILL)  # spawned a moment ago: it is still importing
    stdout, stderr = proc.communicate(timeout=120)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1, stderr[-3000:]
    assert errors[0].startswith("error: the loading pipeline failed: a --decode-processes worker died (1 of 2 gone")
    result = read_json(out)
    assert result["partial"] is True and result["classified"] + result["not_reached"] == 6000
