"""Hostile input, round eighteen (2026-12-07). Each test fails on the code before it."""

from __future__ import annotations

import contextlib
import gc
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
import weakref
from pathlib import Path

import pytest
import torch

import imagenet_classification as ic
from imagenet_classification import _print_sweep, _Sweep, _SweepPoint
from tests.conftest import ROOT, TINY, make_jpeg_set, write_jpeg


def test_a_bad_images_record_holds_none_of_its_batchs_images(tmp_path: Path):
    # Each skipped image was kept with its traceback, whose frames held the decoded images of its
    # batch: all kept until the run's end (a list with a bad image in each batch of 32 held 160 MB
    # more), and in a notebook, nanobind's "leaked" lines at exit despite README's `del batch`.
    good = write_jpeg(tmp_path / "good.JPEG", (320, 240), (200, 40, 40))
    (tmp_path / "bad.JPEG").write_bytes(b"not a JPEG")
    script = f"""
        import imagenet_classification as ic
        decode = ic.get_decode_func("cpu", ic.EvalTransform(), policy=ic.BadImagePolicy(skip=True))
        batch = decode([({str(good)!r}, 1), ({str(tmp_path / "bad.JPEG")!r}, 2), ({str(good)!r}, 3)])
        failures = batch.failures
        del batch
        print(len(failures), failures[0].path.endswith("bad.JPEG"), failures[0].__traceback__)
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "True", "None"]
    assert "leaked" not in proc.stderr, proc.stderr


def test_a_short_windows_rate_is_not_ranked_against_a_steady_ones():
    # A short list: an in-process setting's end-to-end rate was its rate while loading (36), the
    # --decode-processes one's the whole window's, mostly the model's alone after the loader's end
    # (127), both marked ~, and the second was recommended on it. A steady window's rate wins; a
    # recommendation from short windows alone says it is not firm.
    steady, short = _SweepPoint(1, 8, 4, 100, 300, 90.0), _SweepPoint(2, 8, 4, 101, 300, 127.0, 2, True)
    sweep = _Sweep([steady, short], 64)
    assert sweep.recommended is steady
    out = io.StringIO()
    _print_sweep(sweep, ["imagenet_classification.py", "--sweep", "num-threads=1,2"], out)
    text = out.getvalue()
    assert "The smallest setting within 5% of the best: --num-threads 1 --batch-size 8 --queue-size 4\n" in text
    assert "or the model's alone after the loader's last batch" in text
    steady.short_window = True
    assert _Sweep([steady, short], 64).recommended is short
    out = io.StringIO()
    _print_sweep(_Sweep([steady, short], 64), ["imagenet_classification.py"], out)
    flags = "--num-threads 2 --batch-size 8 --queue-size 4 --decode-processes 2"
    assert f"of the best: {flags} (~: its rate is not firm; list more images)\n" in out.getvalue()


def _spawned_workers(pid: int) -> set[int]:
    """``pid``'s children that multiprocessing spawned (``--decode-processes`` workers), started or not."""
    found = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split():
                with contextlib.suppress(OSError):
                    if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                        found.add(int(child))
    return found


def test_a_ctrl_c_as_the_decode_processes_start_prints_no_traceback(tmp_path):
    # Ctrl-C reaches the whole process group: a worker still starting had Python's default SIGINT
    # handler, and printed a KeyboardInterrupt traceback (7 tries in 14 within 0.15 s of the first
    # worker). They start with SIGINT blocked now, and one that gets it ends quietly.
    flist = make_jpeg_set(tmp_path, 40)
    cmd = [sys.executable, str(ROOT / "imagenet_classification.py"), "--input-flist", flist, "--prefix",
           f"{tmp_path}/", *TINY, "--no-compile", "-b", "4", "--decode-processes", "2"]  # fmt: skip
    cmd += ["--num-threads", "1"]
    for delay in (0.0, 0.03, 0.06, 0.09, 0.12, 0.15):
        proc = subprocess.Popen(list(map(str, cmd)), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while not _spawned_workers(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(delay)
            os.killpg(proc.pid, signal.SIGINT)
            sent = time.monotonic()
            _, err = proc.communicate(timeout=60)
            took = time.monotonic() - sent
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err, (delay, err)
        assert took < 2, (delay, took)


def test_an_error_in_a_decode_process_names_its_image(tmp_path):
    # Not a bad image but an error (here a path that is no path; os.open's "embedded null byte" was one,
    # now a bad image): in the main process it named the item; from a --decode-processes worker, whose
    # failure comes as its traceback's text, it did not.
    good = write_jpeg(tmp_path / "good.JPEG", (320, 240), (200, 40, 40))
    script = tmp_path / "notebook.py"  # a worker runs __main__ again: a file
    script.write_text(
        textwrap.dedent(f"""
        import functools
        import imagenet_classification as ic

        if __name__ == "__main__":
            items = [({str(good)!r}, 1)] * 3 + [(123, 2)]
            decode = functools.partial(ic._decode_in_worker, ic.EvalTransform(), 1 << 26)
            pipeline = ic.get_pipeline(items, 2, decode, 1, 2, 1, decode_processes=1)
            try:
                with pipeline.auto_stop():
                    for batch in pipeline:
                        pass
            except Exception as e:
                print(ic._loader_failed(e).args[0])
        """)
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = "TypeError while decoding 123: (123, 2): expected a (path, label) pair, its path a str, not int"
    assert said in proc.stdout, proc.stdout


@pytest.mark.parametrize("script, flist", [("decode_paths", "val200.flist"), ("mix_variants", "imagenet-200.flist")])
def test_a_reused_bench_set_whose_images_no_longer_decode_is_one_error_line(tmp_path, script, flist):
    # A set kept from before, its images gone or replaced (here a folder): an IsADirectoryError
    # traceback. Now left out and counted, as compare_loaders, read_ceiling and gil leave them.
    images = tmp_path / "images"
    (images / "val" / "a.JPEG").mkdir(parents=True)
    (images / flist).write_text("val/a.JPEG\nval/b.JPEG\n")
    args = ["--out", str(tmp_path), "--images", "200", "--max-threads", "1"]
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / f"{script}.py"), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{script}: left out 2 of the set's 2 images, which do not decode" in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith(f"{script}.py: error: argument --images: 200: ")


def test_a_kept_stop_holds_neither_the_loader_nor_its_last_batch():
    # RunStopped's traceback holds benchmark's frame: its loader (a pipeline and the batches it buffers)
    # and last batch stayed alive for as long as the stop was kept (IPython's sys.last_value).
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    size = model.transform.size

    class Loader:
        def __iter__(self):
            yield torch.zeros(2, 3, size, size, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64)

    loader = Loader()
    alive = weakref.ref(loader)
    try:
        ic.benchmark(loader, model, listed=4, warmup_batches=0)  # 2 of 4 delivered: RunStopped, incomplete
    except ic.RunStopped as e:
        kept = e
    del loader
    gc.collect()
    assert kept.kind == "incomplete" and kept.result.classified == 2
    assert alive() is None


def test_a_notebooks_interrupted_dataloader_run_leaves_no_workers_to_the_next(tmp_path):
    # main() from a notebook, --loader torch, interrupted: its workers were abandoned, not waited for
    # (the command line's process ends at once), and each such run left 2 more running, with their
    # pipes and shared memory, till the kernel ended. They are killed as the run ends (not joined:
    # one may be stuck in a read), and the next run closes their queues.
    flist = make_jpeg_set(tmp_path, 40)
    (tmp_path / "long.flist").write_text(flist.read_text() * 200)  # 8,000: still running at 4 s
    script = f"""
        import os, signal, threading
        import imagenet_classification as ic
        from tests.test_hostile15 import _dataloader_workers

        def workers():
            return len(_dataloader_workers(os.getpid()))

        args = ["--prefix", {f"{tmp_path}/"!r}, *{TINY!r}, "--no-compile", "-b", "4", "--loader", "torch"]
        threading.Timer(4, os.kill, (os.getpid(), signal.SIGINT)).start()
        first = ic.main(["--input-flist", {str(tmp_path / "long.flist")!r}, *args])
        left = workers()
        second = ic.main(["--input-flist", {str(flist)!r}, *args])
        print(first, left, second, workers())
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-4:] == ["130", "0", "0", "0"], proc.stdout  # killed as the run ends (2 were left)
