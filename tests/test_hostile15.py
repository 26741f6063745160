"""Hostile input, round fifteen (2026-12-07): what the notebook's result and policy take, and what the
sweeps of this round found. Real files, real subprocesses of the command line, real SPDL, torch and timm."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import imagenet_classification as ic
from tests.conftest import ROOT, TINY, make_jpeg_set, read_json, run_cli
from tests.test_distributed import _free_port
from tests.test_processes import _running


def test_failures_that_are_no_decode_errors_are_type_errors_naming_them():
    with pytest.raises(TypeError, match=r"failures\[0\]='x': expected an ImageDecodeError"):
        ic.BadImagePolicy().check(["x"])
    with pytest.raises(TypeError, match=r"failures\[1\]=3: expected an ImageDecodeError"):
        ic.RunResult(listed=3).record_failures([ic.ImageDecodeError("a.jpg", "cut short"), 3])
    result = ic.RunResult(listed=3)
    result.record_failures([ic.ImageDecodeError("a.jpg", "cut short")])  # the right kind still passes
    assert (result.failed, result.failures) == (1, [{"path": "a.jpg", "reason": "cut short"}])
    with pytest.raises(ic.RunStopped, match="cannot decode a.jpg: cut short"):  # a strict run reads the first only
        ic.BadImagePolicy().check([ic.ImageDecodeError("a.jpg", "cut short"), "x"])


def test_the_policys_ranges_at_their_bounds():
    # The bounds of last round's checks (a percentage of 0 to 100; a count listed of 0 or more, or None).
    assert ic.BadImagePolicy(skip=True, max_bad_percent=0).limit(50) == 0
    assert ic.BadImagePolicy(skip=True, max_bad_percent=100).limit(50) == 50
    for percent in (-0.5, 100.5):
        with pytest.raises(ValueError, match=f"max_bad_percent={percent}: expected a number from 0 to 100"):
            ic.BadImagePolicy(skip=True, max_bad_percent=percent)
    assert ic.BadImagePolicy(skip=True, max_bad=3).limit(None) == 3
    assert ic.BadImagePolicy(skip=True, max_bad_percent=10).limit(0) == 0
    with pytest.raises(ValueError, match=r"listed=-1: expected a number of images, 0 or more \(or None\)"):
        ic.BadImagePolicy(skip=True, max_bad=3).limit(-1)


def test_under_torchrun_a_summary_lost_on_a_full_disk_says_whose_it_was(tmp_path):
    # Rank 1 meets a bad image and stops: it prints its own partial result (each line "rank 1: "),
    # and rank 0 prints the job's. Both stdouts are a full disk: each error line says whose summary it lost.
    flist = make_jpeg_set(tmp_path, 8)
    lines = flist.read_text().splitlines()
    (tmp_path / lines[1]).write_bytes(b"not a JPEG at all" * 20)  # line index 1 falls to rank 1
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    args = ["--input-flist", flist, "--prefix", f"{tmp_path}/", *TINY, "--no-compile", "-b", "2", "--timeout", "15"]
    procs = []
    with open("/dev/full", "w") as full_disk:
        for rank in (0, 1):
            procs.append(subprocess.Popen(
                [sys.executable, str(ROOT / "imagenet_classification.py"), *map(str, args)], cwd=ROOT,
                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}, stdout=full_disk, stderr=subprocess.PIPE,
                text=True,
            ))  # fmt: skip
        errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [1, 1], errors
    for rank, stderr in enumerate(errors):
        assert "Traceback" not in stderr, stderr
        assert f"error: rank {rank}: the summary could not be written to stdout (No space left on device)" in stderr


def test_the_results_say_where_the_command_ran_for_its_relative_paths(tmp_path):
    # The command "to run it again" holds the paths as typed: relative ones need the folder they started from.
    make_jpeg_set(tmp_path, 4)
    proc = run_cli("--input-flist", "val.flist", *TINY, "--no-compile", "-b", "2", "--results-file", "r.json",
                   cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    config = read_json(tmp_path / "r.json")["config"]
    assert config["cwd"] == str(tmp_path) and "--input-flist val.flist" in config["command"]


def _dataloader_workers(pid: int) -> set[int]:
    """The DataLoader workers of ``pid`` (its main thread's children named so by torch as each starts)."""
    found = set()
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        with contextlib.suppress(OSError):  # gone already
            if Path(f"/proc/{child}/comm").read_text().strip() == "pt_data_worker":
                found.add(int(child))
    return found


def test_frozen_dataloader_workers_are_not_joined_after_the_time_out(tmp_path):
    # Workers frozen (SIGSTOP) before their first batch, as stuck as in a hung read: at --timeout the
    # run stops, and ends, where torch joined each stuck worker for 5 s first. (Frozen with a batch
    # sent and not yet taken, they hang the main process inside torch, which Ctrl-C alone ends.)
    flist = make_jpeg_set(tmp_path, 8, sizes=((4000, 3000),))  # a batch takes a worker seconds
    cmd = [sys.executable, str(ROOT / "imagenet_classification.py"), "--input-flist", flist, "--prefix",
           f"{tmp_path}/", *TINY, "--no-compile", "-b", "4", "--loader", "torch", "--timeout", "3"]  # fmt: skip
    proc = subprocess.Popen(list(map(str, cmd)), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    frozen: set[int] = set()
    deadline = time.monotonic() + 120
    try:
        while len(frozen) < 2 and proc.poll() is None and time.monotonic() < deadline:
            for pid in _dataloader_workers(proc.pid) - frozen:
                os.kill(pid, signal.SIGSTOP)
                frozen.add(pid)
        stopped = time.monotonic()
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - stopped
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
    assert len(frozen) == 2 and proc.returncode == 3 and "Traceback" not in err, err
    assert "error: no batch for 3 s (--timeout) from the DataLoader's workers" in err
    assert "Images: listed=8 classified=0 failed=0 not_reached=8 (PARTIAL RUN)" in out and took < 10, took


def test_an_output_that_is_an_input_under_another_name_is_refused(tmp_path):
    # The same file reached by a path whose real path differs: a bind mount of the dataset (as a
    # container may have it), whose results would replace the list or an image. Here hard links, which
    # need no root: refused alike, one file by device and inode.
    flist = make_jpeg_set(tmp_path, 4)
    image = tmp_path / flist.read_text().split()[1]
    view = tmp_path / "view"
    view.mkdir()
    for original in (flist, image):
        os.link(original, view / original.name)
        proc = run_cli("--input-flist", flist, "--prefix", f"{tmp_path}/", *TINY, "--no-compile",
                       "--results-file", view / original.name)  # fmt: skip
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        why = "that file is one of the run's inputs or outputs; writing would replace it"
        assert f"error: --results-file {view / original.name}: {why}" in proc.stderr


def test_output_names_as_long_as_the_start_up_check_passes_are_written(tmp_path):
    # Each output was written beside itself as ".NAME.<12 hex>.tmp": 18 bytes more than a name the
    # start-up check passed, so a name of 238 to 255 bytes lost every output after the whole run.
    flist = make_jpeg_set(tmp_path, 4)
    results, rows = tmp_path / ("r" * 245 + ".json"), tmp_path / ("p" * 249 + ".jsonl")  # 250 and 255 bytes
    proc = run_cli("--input-flist", flist, "--prefix", f"{tmp_path}/", *TINY, "--no-compile", "--results-file",
                   results, "--predictions-file", rows, "--trace", tmp_path / ("t" * 240))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert read_json(results)["classified"] == 4 and len(rows.read_text().splitlines()) == 4
    assert (tmp_path / ("t" * 240 + ".pftrace")).stat().st_size > 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no scratch file left


def test_a_trace_into_a_folder_whose_files_cannot_be_removed_says_why(tmp_path):
    # chattr +a: files can be made there, not renamed or removed. The trace's scratch folder could not
    # be cleaned up, and its RecursionError was the only reason given.
    flist = make_jpeg_set(tmp_path, 4)
    out = tmp_path / "out"
    out.mkdir()
    if subprocess.run(["chattr", "+a", str(out)], capture_output=True).returncode != 0:
        pytest.skip("chattr +a is not possible here (not root, or a file system without it)")
    try:
        proc = run_cli("--input-flist", flist, "--prefix", f"{tmp_path}/", *TINY, "--no-compile",
                       "--trace", out / "t")  # fmt: skip
    finally:
        subprocess.run(["chattr", "-a", str(out)], check=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "Recursion" not in proc.stderr, proc.stderr
    assert f"error: {out / 't'}: cannot write the trace there (Operation not permitted)" in proc.stderr


@pytest.mark.parametrize("flag", ["--data-dir", "DATA_DIR", "--input-flist", "--labels", "--checkpoint"])
def test_an_empty_input_path_is_refused_not_taken_for_the_current_folder(tmp_path, flag):
    # --data-dir "$VAL" with VAL unset benchmarked whatever folder the command ran in.
    make_jpeg_set(tmp_path, 4)
    args = {"DATA_DIR": [""], "--data-dir": ["--data-dir", ""]}.get(flag, ["--input-flist", "val.flist", flag, ""])
    proc = run_cli(
        *args, *TINY, "--no-compile", cwd=tmp_path / "val" if flag in ("DATA_DIR", "--data-dir") else tmp_path
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"error: argument {flag}: an empty path (a variable not set?)" in proc.stderr


def test_class_folders_that_are_not_there_or_empty_are_said(tmp_path, caplog):
    # A class folder that is a link to an unmounted volume left its images out without a word, and
    # an empty class folder (an archive half extracted) was not said either.
    make_jpeg_set(tmp_path, 4)
    folder = tmp_path / "val"
    (folder / "n01514668").mkdir()
    (folder / "n01443537").mkdir()
    with caplog.at_level("WARNING", logger="imagenet_classification"):
        assert len(ic.scan_folder(folder)) == 4
    assert f"{folder}: 2 class folders with no image: n01443537 n01514668" in caplog.messages
    (folder / "n01484850").symlink_to("/nonexistent/n01484850")
    proc = run_cli(folder, *TINY, "--no-compile")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"error: {folder}/n01484850: named as a class, but a link to nothing (an unmounted volume?)" in proc.stderr


@pytest.mark.parametrize("kind", ["fifo", "zeros"])
def test_a_class_table_that_is_no_file_is_named_not_waited_on_or_read_forever(tmp_path, kind):
    # The module beside a FIFO (the run waited for a writer, for ever) or a link to /dev/zero (the
    # run read it to 16 GB of memory) in place of imagenet_class.tsv: an install tampered with.
    (tmp_path / "imagenet_classification.py").write_bytes((ROOT / "imagenet_classification.py").read_bytes())
    table = tmp_path / "imagenet_class.tsv"
    os.mkfifo(table) if kind == "fifo" else table.symlink_to("/dev/zero")
    flist = make_jpeg_set(tmp_path / "data", 2)
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "imagenet_classification.py"), "--input-flist", str(flist), *TINY],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"error: {table}: cannot read the class table (" in proc.stderr


def test_the_class_from_the_path_is_as_readme_says():
    # README said "standing alone in the name" where any name of the path is read: folders named
    # n01440764_tench are a layout met in the wild.
    assert ic.parse_wnid("n01440764_tench/1.JPEG") == "n01440764"
    assert ic.parse_wnid("a/n02123045_extra/n07920052.JPEG") == "n02123045"  # the first, standing alone
    assert ic.parse_wnid("n02123045/n07920052/cat.JPEG") == "n07920052"  # the last folder named by one
    with pytest.raises(ValueError, match="no WordNet ID"):
        ic.parse_wnid("xn01440764/n014407645.JPEG")  # none stands alone


def _torch_loader_run(tmp_path: Path, *extra: str, settle: float = 2) -> tuple[subprocess.Popen, set[int]]:
    """A --loader torch run of 8,000 images in its own process group, ``settle`` seconds under way; its
    DataLoader workers."""
    flist = make_jpeg_set(tmp_path, 8)
    (tmp_path / "long.flist").write_text(flist.read_text() * 1000)
    cmd = [sys.executable, str(ROOT / "imagenet_classification.py"), "--input-flist", tmp_path / "long.flist",
           "--prefix", f"{tmp_path}/", *TINY, "--no-compile", "-b", "8", "--loader", "torch", *extra]  # fmt: skip
    proc = subprocess.Popen(list(map(str, cmd)), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    while "images listed" not in proc.stderr.readline():
        assert proc.poll() is None
    deadline = time.monotonic() + 60
    while len(workers := _dataloader_workers(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(settle)  # batches classified
    return proc, workers


def test_a_sigterm_to_the_whole_group_costs_the_dataloader_baseline_no_file(tmp_path):
    # torchrun, systemd, `timeout` signal the group: the workers died too, and torch's SIGCHLD handler
    # raised its "DataLoader worker is killed" inside the writing of a file asked for, which was lost.
    results, rows = tmp_path / "r.json", tmp_path / "p.csv"
    proc, _ = _torch_loader_run(tmp_path, "--results-file", str(results), "--predictions-file", str(rows), settle=6)
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "Traceback" not in err and "not written" not in err, err
    result = read_json(results)
    assert result["partial"] and result["classified"] == len(rows.read_text().splitlines()) - 1 > 0


def test_dataloader_workers_end_with_a_main_process_killed_at_once(tmp_path):
    # Killed at once (a second signal, or SIGKILL here, which a test can time), the main process left
    # its workers to torch's 5 s watch of their parent, holding its stdout (a pipe to tee) open.
    proc, workers = _torch_loader_run(tmp_path)
    proc.kill()
    proc.wait(timeout=60)  # not communicate: the workers hold its pipes
    gone = time.monotonic()
    while any(map(_running, workers)) and time.monotonic() - gone < 10:  # a zombie is no worker running
        time.sleep(0.05)
    assert len(workers) == 2 and time.monotonic() - gone < 2, time.monotonic() - gone
    proc.communicate(timeout=60)


def test_a_stopped_jobs_fps_is_over_the_ranks_past_their_warm_up_only():
    # A job stopped while rank 1 was still in its warm-up: its window (the start included) is not mixed
    # into rank 0's, whose window alone gives the job's FPS; every image still counts in the totals.
    cpu = torch.device("cpu")
    past = ic.RunResult(listed=10, classified=6, frames_timed=4, elapsed_s=2.0, batches_timed=4, loader_lead=3)
    warming = ic.RunResult(
        listed=10, classified=2, frames_timed=2, elapsed_s=1.0, batches_timed=1, warmup_included=True
    )
    job = ic._job_total([ic._rank_share(past, 0, cpu), ic._rank_share(warming, 1, cpu)], 10, past)
    assert (job.classified, job.frames_timed, job.elapsed_s, job.batches_timed) == (8, 4, 2.0, 4)
    # The timed rank's lead alone (3), not both ranks' (6, capped at the window's 4).
    assert (job.warmup_included, job.fps, job.loader_lead) == (False, 2.0, 3)
