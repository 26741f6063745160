"""Hostile input, round sixteen (2026-12-07): what a sweep of the command line's less used flags
found (--breakdown, --sweep, the time limits, the page cache line). Real files, real SPDL, torch
and timm, the command line run in this process (``run_main``)."""

from __future__ import annotations

import functools
import io
import json
import logging
import multiprocessing
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import torch

import imagenet_classification as ic
from tests.conftest import ROOT, TINY, make_jpeg_set, read_json, run_main
from tests.test_cli import readme_notebook_code, run_in_the_demo


def test_a_breakdown_the_run_never_reached_is_said_and_recorded(tmp_path, capfd):
    # A bad image stops the run: the breakdown is not run, and the summary and the results file say
    # so (it was silently missing). The run's own reason stays its stop_reason.
    flist = make_jpeg_set(tmp_path, 8)
    (tmp_path / flist.read_text().splitlines()[2]).write_bytes(b"not a JPEG" * 50)
    out = tmp_path / "r.json"
    proc = run_main(capfd, "--input-flist", flist, "--prefix", f"{tmp_path}/", *TINY, "--no-compile", "-b", "2",
                    "--warmup-batches", "1", "--breakdown", "--results-file", out)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "(PARTIAL RUN)" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "Breakdown not run: the run stopped before it"
    assert "Breakdown cut short" not in proc.stdout and "result above is complete" not in proc.stdout
    result = read_json(out)
    assert result["breakdown_cut"] == "not run: the run stopped before it" and "breakdown" not in result
    assert result["partial"] is True and result["stop_reason"].startswith("cannot decode ")


def test_the_time_limits_say_their_least_value(capfd):
    # 0.0001 is above 0: the message gave the wrong bound.
    for flag, expected in (("--timeout", "at most 1e6 seconds, at least 0.001"),
                           ("--stats-interval", "a number of seconds, at least 0.001")):  # fmt: skip
        proc = run_main(capfd, "/nowhere", flag, "0.0001")
        assert proc.returncode == 2
        assert f"error: argument {flag}: expected {expected}, got '0.0001'" in proc.stderr
    proc = run_main(capfd, "/nowhere", "--timeout", "0.001", "--stats-interval", "0.001", "--version")
    assert proc.returncode == 0, proc.stderr  # the bound itself is taken


def test_a_file_over_the_size_limit_is_said_as_such_in_the_page_cache_line(tmp_path):
    small, big = tmp_path / "small.JPEG", tmp_path / "big.JPEG"
    small.write_bytes(b"x" * 100)
    big.write_bytes(b"x" * 5000)
    cache = ic._examine_page_cache([str(small), str(big)], max_bytes=1000)
    assert (cache.files, cache.skipped, cache.bytes) == (1, 1, 100)
    line = ic._page_cache_lines(cache)[0]
    assert line.endswith("; 1 listed path not examined (not opened as regular files, or over --max-image-mb)")


def test_counts_of_one_are_singular():
    assert [ic._images(n) for n in (0, 1, 2)] == ["0 images", "1 image", "2 images"]
    assert [ic._images(n, "batch") for n in (1, 2)] == ["1 batch", "2 batches"]
    assert [ic._images(n, "process") for n in (1, 3)] == ["1 process", "3 processes"]
    out = io.StringIO()
    one = ic.RunResult(listed=8, classified=8, frames_timed=4, elapsed_s=1.0, batches=2, batches_timed=1,
                       loader_lead=3, decoder_fallbacks=1)  # fmt: skip
    ic._print_summary(one, out)
    assert "WARNING: the FPS window holds 1 batch and the loader may have had all of them ready" in out.getvalue()
    assert "  1 image (12.5%) decoded on the CPU: the GPU decoder cannot take them" in out.getvalue()


def _breakdown_report(
    batches_timed: int, at_once: int, processes: int = 0, included: bool = False, warmup: int = 1
) -> str:
    result = ic.RunResult(listed=400, classified=400, frames_timed=4 * batches_timed, elapsed_s=10.0,
                          batches=100, batches_timed=batches_timed, warmup_included=included)  # fmt: skip
    config = {"loader": "spdl", "decode_concurrency": at_once, "decode_processes": processes, "warmup_batches": warmup}
    breakdown = ic._Breakdown.from_rates(40.0, 600.0, 36.0, torch.device("cpu"))
    out = io.StringIO()
    ic._print_report(ic._RunReport(result, config, {}, [], breakdown=breakdown), out)
    return out.getvalue()


def test_the_loader_alones_short_window_is_warned_of_by_hand():
    # The loader alone opens its window with up to the batches decoded at once under way: T timed
    # batches need only T - at_once from it, so its rate may be at_once / (T - at_once) high.
    said = "WARNING: the loader alone's window holds"
    assert said not in _breakdown_report(22, 2)  # 2 / 20: at the 10 % allowed
    assert f"{said} 21 batches and opened with up to 2 under way: its rate may be up to 11% high; list more " \
        "images (repeating the list is fine)" in _breakdown_report(21, 2)  # fmt: skip
    assert f"{said} 1 batch and opened with up to 2 under way: its rate may be that of batches already decoded" \
        in _breakdown_report(1, 2)  # fmt: skip
    assert f"{said} 2 batches and opened with up to 2 under way: its rate may be that of" in _breakdown_report(2, 2)
    assert said not in _breakdown_report(44, 2, processes=2)  # 2 threads in each of 2 processes: 4 / 40
    assert f"{said} 43 batches and opened with up to 4 under way: its rate may be up to 10% high" \
        in _breakdown_report(43, 2, processes=2)  # fmt: skip
    assert said not in _breakdown_report(1, 2, warmup=0)  # no warm-up: its window opens with nothing under way
    included = _breakdown_report(1, 2, included=True)  # the warning of the whole breakdown says it
    assert said not in included and "each rate below includes its warm-up" in included


def test_the_sweeps_caps_say_what_capped_them(caplog):
    # Threads and batch sizes are capped at the images listed; worker processes at the batches of
    # the smallest batch size (it said "at the 10 images listed" for those too).
    args = ic._parse_args(["/d", "--sweep", "num-threads=1,64", "batch-size=4", "decode-processes=1,9"])
    with caplog.at_level(logging.INFO, logger=ic._LG.name):
        grid = ic._sweep_grid(args, 10)
    assert (grid["num-threads"], grid["decode-processes"]) == ([1, 10], [1, 3])
    assert "Sweep: num-threads=1,64 capped at the 10 images listed." in caplog.text
    assert (
        "Sweep: decode-processes=1,9 capped at the 3 batches of the smallest batch size, one a process." in caplog.text
    )
    caplog.clear()
    args = ic._parse_args(["/d", "--loader", "torch", "--sweep", "num-threads=1,64", "batch-size=5"])
    with caplog.at_level(logging.INFO, logger=ic._LG.name):
        assert ic._sweep_grid(args, 10)["num-threads"] == [1, 2]  # a DataLoader worker is a process
    assert "Sweep: num-threads=1,64 capped at the 2 batches of the smallest batch size, one a process." in caplog.text
    assert "images listed" not in caplog.text


# --- The notebook's API (a sweep of it) ----------------------------------------------------------------


def test_the_readme_notebook_pattern_keeps_a_stalled_runs_result(demo_photos, lite0_checkpoint, tmp_path):
    # A decode thread stuck in a hung read: auto_stop's exit raised SPDL's TimeoutError, which hid the
    # RunStopped and its result. The README's pattern, run as written but for a loader that hangs.
    code = readme_notebook_code()
    hang = "import time\ncalls = []\ndef hangs(items):  # the first batch only, then a read that hangs\n"
    hang += "    calls.append(1)\n    time.sleep(0 if len(calls) == 1 else 15)\n    return decode(items)\n"
    for old, new in (("pipeline = get_pipeline(", f"{hang}pipeline = get_pipeline("),
                     ("decode_func=decode,", "decode_func=hangs,"), ("timeout=60", "timeout=2")):  # fmt: skip
        assert code.count(old) == 1, old
        code = code.replace(old, new)
    code += "\nprint(result.partial, result.classified, result.stop_reason)"
    proc = run_in_the_demo(code, demo_photos, lite0_checkpoint, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "TimeoutError" not in proc.stderr
    # The partial result: the first batch's 8 images classified, and the stall said.
    assert proc.stdout.splitlines()[-1].startswith("True 8 no batch within the loader's time-out"), proc.stdout


def test_labels_that_name_no_class_of_the_model_are_counted_as_misses_and_warned_of():
    # A loader's own labels: 5000 and -5 were silent misses (a decode item's are refused), and so was
    # -1 (unknown): each lowers top-1 and top-5 as a miss, so the run says how many there were.
    bundle = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    size = bundle.transform.size
    images = torch.randint(0, 255, (4, 3, size, size), dtype=torch.uint8)
    labels = torch.tensor([[0], [1000], [-1], [-2]])  # either side's first past the classes, and -1
    message = r"^3 labels of the batches named no class of the model's \(0-999; -1: unknown\): counted as misses"
    with pytest.warns(UserWarning, match=message):
        result = ic.benchmark([(images, labels)], bundle, warmup_batches=0)
    assert (result.classified, result.not_reached) == (4, 0)
    with pytest.warns(UserWarning, match=r"^1 label of the batches named no class"):
        ic.benchmark([(images, torch.tensor([[0], [999], [-1], [5]]))], bundle, warmup_batches=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # classes of the model, the first and the last: no warning
        ic.benchmark([(images, torch.tensor([[0], [999], [3], [5]]))], bundle, warmup_batches=0)


def test_a_stalled_decode_process_run_leaves_no_stall_entry(jpeg_set, capfd):
    # After a --decode-processes run stalled, its wait stayed in the stall registry: every later stall
    # in the interpreter (a notebook's threaded pipeline) named "a batch in a --decode-processes worker".
    proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--no-compile",
                    "--decode-processes", "1", "--timeout", "0.2")  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert "the decode stage has been on a batch in a --decode-processes worker for" in proc.stderr
    assert -1 not in ic._DECODING and ic._oldest_in_progress() is None


def test_ending_the_workers_spares_the_processes_started_before_the_run():
    # An interrupted --decode-processes run in a notebook killed every multiprocessing child, the notebook's own too.
    spawn = multiprocessing.get_context("spawn")
    mine, pools = spawn.Process(target=time.sleep, args=(60,)), spawn.Process(target=time.sleep, args=(60,))
    mine.start()
    pools.start()
    try:
        ic._end_children(frozenset({mine}))
        pools.join(10)
        assert not pools.is_alive() and mine.is_alive()
    finally:
        mine.kill()
        mine.join(10)


_TYPED = """
import sys
import imagenet_classification as ic
def mydecode(items):
    return items
try:
    ic.get_pipeline([("a.JPEG", 0)], 1, mydecode, 1, 1, 1, decode_processes=1)
except TypeError as e:
    print(e)
"""


def test_a_decode_function_no_worker_can_import_is_refused(tmp_path):
    # Typed into python -c (as into a notebook) or read from stdin, the function passed pickle's check
    # (by name), then each worker failed to find it: a stall, or a hang without a time-out.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    typed = subprocess.run([sys.executable, "-c", _TYPED], capture_output=True, text=True, timeout=120, env=env)
    said = "decode_func=<function mydecode at "
    assert typed.stdout.startswith(said), typed.stderr
    said = "is defined in __main__ (a notebook, python -c), which a worker process cannot import: define it in a "
    assert said + "module file and import it, or decode_processes=0" in typed.stdout
    piped = subprocess.run([sys.executable, "-"], input=_TYPED, capture_output=True, text=True, timeout=120, env=env)
    said = "decode_processes: a worker process runs __main__ again from its file, and there is none at '<stdin>' "
    assert said + "(stdin?): run the script from its file, or decode_processes=0" in piped.stdout, piped.stderr
    assert "FileNotFoundError" not in piped.stderr and "Traceback" not in piped.stderr
    # The command line read from stdin: one line before the run, not a TypeError as a bug's.
    flist = make_jpeg_set(tmp_path, 4)
    args = ["-", "--input-flist", flist, "--prefix", f"{tmp_path}/", *TINY, "--decode-processes", "1"]
    with open(ROOT / "imagenet_classification.py") as module:
        cli = subprocess.run([sys.executable, *map(str, args)], stdin=module, capture_output=True, text=True,
                             timeout=120, env=env)  # fmt: skip
    assert cli.returncode == 2, cli.stderr
    assert cli.stderr.splitlines()[-1] == ("error: --decode-processes: a worker process runs __main__ again from its "
                                          "file, and there is none at '<stdin>' (stdin?): run the script from its "
                                          "file, or give no worker processes")  # fmt: skip
    # A script's own function reaches its workers (they run the script again): it runs.
    script = tmp_path / "script.py"
    script.write_text(f"""
import imagenet_classification as ic
TRANSFORM = ic.EvalTransform(size=64, crop_pct=1.0)
def mydecode(items):
    return ic._decode_in_worker(TRANSFORM, 1 << 20, items)
if __name__ == "__main__":
    images = ic.read_file_list({str(flist)!r}, prefix={f"{tmp_path}/"!r})
    pipeline = ic.get_pipeline(images, 2, mydecode, 1, 2, 1, decode_processes=1)
    with pipeline.auto_stop():
        print(sum(batch[0].shape[0] for batch in pipeline.get_iterator(timeout=120)))
""")
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env)
    assert ran.returncode == 0 and ran.stdout.split()[-1] == "4", ran.stderr


def _fails_in_the_worker(items):  # a module's function: a spawned worker imports it
    raise ValueError("a reason of the decode function's own")


def test_a_decode_process_failure_is_one_line_with_its_root_cause(jpeg_set):
    # A worker's failure comes as the text of its traceback: the run's reason was 60 lines of it.
    images = ic.read_file_list(jpeg_set, prefix=f"{jpeg_set.parent}/").head(4)
    bundle = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    pipeline = ic.get_pipeline(images, 2, _fails_in_the_worker, 1, 2, 1, decode_processes=1)
    with pytest.raises(ic.RunStopped) as stopped, pipeline.auto_stop():
        ic.benchmark(pipeline.get_iterator(timeout=120), bundle, listed=4, warmup_batches=0)
    reason = str(stopped.value)
    assert "\n" not in reason and stopped.value.kind == "loader"
    assert reason.startswith("the loading pipeline failed: RuntimeError: ")
    assert reason.endswith(", from ValueError: a reason of the decode function's own (the log above says where)")
    assert stopped.value.result.stop_reason == reason


def test_get_pipeline_takes_numpy_sizes(jpeg_set):
    # buffer_size=np.int64(2) failed in SPDL ("buffer_size must be int"), as no other size did.
    images = ic.read_file_list(jpeg_set, prefix=f"{jpeg_set.parent}/").head(4)
    decode = functools.partial(ic._decode_in_worker, ic.EvalTransform(size=32, crop_pct=1.0), 1 << 20)
    sizes = (np.int64(1), np.int64(2), np.int64(1))  # concurrency, buffer_size, num_threads
    pipeline = ic.get_pipeline(images, np.int64(2), decode, *sizes, decode_processes=np.int64(1))
    with pipeline.auto_stop():
        assert sum(batch[0].shape[0] for batch in pipeline.get_iterator(timeout=120)) == 4


def test_main_in_a_notebook_leaves_its_random_generator_as_it_was(jpeg_set, capfd):
    # Random weights are seeded (the same on every rank and run): the caller's generator was reset to 0.
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--no-compile",
                    "--max-samples", "4", "-b", "2", "--warmup-batches", "0")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert torch.equal(torch.rand(3), expected)


def test_measure_loader_of_no_batch_warns_as_benchmark_does():
    with pytest.warns(ic.WarmupIncluded, match="no batch held images: the loader yielded none"):
        assert ic.measure_loader([], "cpu", 0) == 0.0


def test_an_image_list_of_paths_holds_strings_the_results_file_can_write(tmp_path):
    # Path objects were kept: a failure's path then made json.dumps of the result raise.
    images = ic.ImageList((tmp_path / "a.JPEG", b"b.JPEG", "c.JPEG"), (1, 2, 3))
    assert images.paths == (str(tmp_path / "a.JPEG"), "b.JPEG", "c.JPEG")
    result = ic.RunResult(listed=3)
    result.record_failures([ic.ImageDecodeError(images.paths[0], "cut short")])
    assert json.loads(json.dumps(result.to_dict()))["failures"][0]["path"] == str(tmp_path / "a.JPEG")


def test_a_csv_results_file_warns_that_it_holds_no_breakdown_or_parity(jpeg_set, tmp_path, caplog):
    # The row has the run's figures only: --breakdown's and --parity's were lost without a word.
    images = ic.read_file_list(jpeg_set, prefix=f"{jpeg_set.parent}/")
    for flags, lost in (
        (["--breakdown", "--parity", "4"], "--breakdown and --parity"),
        (["--parity", "4"], "--parity"),
    ):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=ic._LG.name):
            ic._check_files(ic._parse_args([str(jpeg_set), "--results-file", str(tmp_path / "r.CSV"), *flags]), images)
        assert f"a CSV row holds no {lost} figures (a .json name writes them)." in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=ic._LG.name):
        ic._check_files(
            ic._parse_args([str(jpeg_set), "--results-file", str(tmp_path / "r.json"), "--breakdown"]), images
        )
        ic._check_files(ic._parse_args([str(jpeg_set), "--results-file", str(tmp_path / "r.csv")]), images)
    assert "CSV row" not in caplog.text


def test_sweep_settings_joined_to_the_flag_by_an_equals_sign_are_said_as_such(capfd):
    proc = run_main(capfd, "/d", "--sweep=num-threads=1", "batch-size=2")
    assert proc.returncode == 2
    said = "batch-size=2: a --sweep setting after another flag (--sweep=num-threads=1 takes its one setting alone); "
    said += "give --sweep's settings together after it"
    assert said in proc.stderr
    proc = run_main(capfd, "/d", "--sweep", "num-threads=1", "--skip-bad", "batch-size=2")  # as before
    assert (
        "batch-size=2: a --sweep setting after another flag; give --sweep's settings together after it" in proc.stderr
    )


def test_a_batch_that_is_no_pair_is_named_by_its_kind_and_length():
    # A DataLoader's triple, a dict of two: each a TypeError saying what it is (make mutate's timing group).
    images, labels = torch.zeros(2, 3, 8, 8, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.int64)
    pair = {"images": images, "labels": labels}
    for batch, said in (((images, labels, ["a", "b"]), "a tuple of 3"), (pair, "a dict"), ([images], "a list of 1")):
        with pytest.raises(TypeError, match=f"^a batch that is {said}: expected a pair"):
            ic._record_batch(batch, [], 0, None)
    failures: list = []
    ic._record_batch([images, labels], failures, 0, None)  # a list of two is a pair
    assert failures == []
