"""Hostile input, round eleven: what a fresh sweep found (2026-12-06). Each test fails on the code before it."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import imagenet_classification as ic
from tests.conftest import CLASSES, ROOT, TINY, label_colour, make_jpeg_set, run_main, write_jpeg
from tests.test_distributed import _free_port

# --- What the CPU path decodes with PIL, counted ---------------------------------------------------------


def test_the_images_pil_decodes_on_the_cpu_path_are_counted_and_said(tmp_path, capfd):
    # A folder of BMPs (or CMYK JPEGs, or animated PNGs) is decoded by PIL, not FFmpeg: the run's
    # FPS was PIL's, and nothing said so (decoder_backends was empty on the CPU path).
    wnid = "n01440764"
    lines = []
    for i in range(6):
        kind = "BMP" if i % 3 == 0 else "JPEG"
        path = tmp_path / wnid / f"img{i}.{kind.lower()}"
        lines.append(str(write_jpeg(path, (100 + 2 * i, 120), label_colour(CLASSES[wnid]), format=kind)))
    batch = ic.get_decode_func("cpu", ic.EvalTransform(size=32))([(p, 0) for p in lines])
    assert batch.decoded_by == {"ffmpeg": 4, "pil": 2}
    flist = tmp_path / "list.txt"
    flist.write_text("\n".join(lines) + "\n")
    results = tmp_path / "r.json"
    run = run_main(capfd, "--input-flist", flist, *TINY, "-b", "3", "--warmup-batches", "0", "--results-file", results)
    assert run.returncode == 0, run.stderr
    assert json.loads(results.read_text())["decoder_backends"] == {"ffmpeg": 4, "pil": 2}
    assert "2 images (33.3%) decoded by PIL, not FFmpeg" in run.stdout
    assert "decoded on the GPU" not in run.stdout


def test_a_run_that_pil_never_decodes_says_nothing_of_pil(jpeg_set, capfd):
    run = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "-b", "10",
                   "--warmup-batches", "0", "--img-size", "32")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "decoded by PIL" not in run.stdout and "decoded on the GPU" not in run.stdout


# --- torchrun: a rank 0 that stops counts the ranks that finished -------------------------------------


def test_a_rank_0_stopped_by_its_own_bad_image_counts_the_shard_another_rank_finished(tmp_path):
    # Rank 0 waited for no other rank's word when it stopped on its own failure: rank 1's six images,
    # all classified, were reported as not reached, and rank 1's own summary had no "rank 1:" label.
    flist = make_jpeg_set(tmp_path, 12)
    lines = flist.read_text().splitlines()
    (tmp_path / lines[10]).write_bytes(b"not a JPEG at all" * 20)  # rank 0's last image
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    procs = []
    for rank in (0, 1):
        cmd = [sys.executable, str(ROOT / "imagenet_classification.py"), "--input-flist", str(flist), "--prefix",
               f"{tmp_path}/", *TINY, "--num-threads", "1", "--no-compile", "--batch-size", "2", "--warmup-batches",
               "1", "--timeout", "15", "--results-file", str(tmp_path / f"r{rank}.json")]  # fmt: skip
        rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        procs.append(subprocess.Popen(cmd, env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [1, 1], outputs
    job = json.loads((tmp_path / "r0.json").read_text())
    ranks = {entry["rank"]: entry for entry in job["ranks"]}
    assert ranks[1]["classified"] == 6 and ranks[1]["stop_reason"] is None  # it finished its shard
    assert job["classified"] == ranks[0]["classified"] + 6 and job["failed"] == 1
    assert job["not_reached"] == 12 - job["classified"] - 1
    rank1_out = [line for line in outputs[1][0].splitlines() if line.strip()]
    assert rank1_out and all(line.startswith("rank 1: ") for line in rank1_out), outputs[1][0]


# --- A signal while a batch is counted, or while the result is filled ------------------------------------

FAST = [*TINY, "--no-compile", "--batch-size", "4", "--warmup-batches", "1", "--img-size", "32"]


def test_a_signal_after_the_last_batch_keeps_the_whole_result(capfd, jpeg_set, tmp_path, monkeypatch):
    # SIGTERM while the predictions' rows were made (2 s for 50,000 images) lost the whole run:
    # classified=0, not_reached=30, an empty predictions file.
    rows, calls = ic._prediction_rows, []

    def signalled(*args):
        calls.append(args)
        if len(calls) == 1:  # a batch's rows at a time: a second signal would end the process
            os.kill(os.getpid(), signal.SIGTERM)
        return rows(*args)

    monkeypatch.setattr(ic, "_prediction_rows", signalled)
    out, predictions = tmp_path / "r.json", tmp_path / "p.csv"
    proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *FAST,
                    "--results-file", out, "--predictions-file", predictions)  # fmt: skip
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert "error: interrupted by SIGTERM" in proc.stderr
    result = json.loads(out.read_text())
    assert (result["classified"], result["not_reached"], result["partial"]) == (30, 0, False)
    assert len(predictions.read_text().splitlines()) == 1 + 30


def _signal_on_third_batch(monkeypatch) -> None:
    """SIGINT as the third batch is counted: between the counters' updates, without the hold."""
    add, calls = ic._TimingWindow.add, []

    def signalled(window, frames):
        calls.append(frames)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return add(window, frames)

    monkeypatch.setattr(ic._TimingWindow, "add", signalled)


def test_a_signal_while_a_batch_is_counted_leaves_every_count_agreeing(capfd, jpeg_set, tmp_path, monkeypatch):
    # A signal between the counters' updates counted a batch's hits without its images (top-1 of 200 %),
    # or its images without its place in the FPS window and the timeline.
    _signal_on_third_batch(monkeypatch)
    out, predictions = tmp_path / "r.json", tmp_path / "p.csv"
    proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *FAST,
                    "--results-file", out, "--predictions-file", predictions)  # fmt: skip
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr
    result = json.loads(out.read_text())
    assert result["partial"] and result["classified"] == 12  # the third batch counted whole
    assert sum(result["timeline"]["batch_images"]) == result["classified"]
    assert result["top1_correct"] <= result["top5_correct"] <= result["classified"]
    assert len(predictions.read_text().splitlines()) == 1 + result["classified"]


# --- A locale whose file names are not UTF-8 --------------------------------------------------------------


def test_a_lists_names_are_the_files_names_in_a_locale_that_is_not_utf8(tmp_path):
    # With a file system encoding that is not UTF-8 (a Latin-1 or ASCII locale), a UTF-8 list's
    # café.JPEG was opened as other bytes: another file classified (caf\xe9.JPEG, a Latin-1 name),
    # silently, or with ASCII a traceback; the outputs named files that are not there.
    folder = tmp_path / "n01440764"
    write_jpeg(folder / "café.JPEG", (120, 100), label_colour(0))
    flist = tmp_path / "list.txt"
    flist.write_text(f"{folder}/café.JPEG\n{folder}/naïve.JPEG\n", encoding="utf-8")
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    out, rows = tmp_path / "r.json", tmp_path / "p.csv"
    cmd = [sys.executable, "-c", "import sys; print(sys.getfilesystemencoding())"]
    assert subprocess.run(cmd, env=env, capture_output=True, text=True).stdout.strip() == "ascii"
    cmd = [sys.executable, str(ROOT / "imagenet_classification.py"), "--input-flist", str(flist), *FAST, "--skip-bad",
           "--results-file", str(out), "--predictions-file", str(rows)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    result = json.loads(out.read_text(encoding="utf-8"))
    assert (result["classified"], result["failed"]) == (1, 1)
    assert result["failures"][0]["path"] == f"{folder}/naïve.JPEG"
    assert f"{folder}/café.JPEG".encode() in rows.read_bytes()


# --- No image classified: no accuracy -------------------------------------------------------------------


def test_a_run_that_classified_nothing_has_no_accuracy_not_a_100_percent_error(capfd, tmp_path):
    # The CSV row said top1 0.0, top1_err 100.0: a reader of the file alone saw a model that is always wrong.
    flist = tmp_path / "list.txt"
    flist.write_text("".join(f"{tmp_path}/n01440764/{i}.JPEG\n" for i in range(2)))
    (tmp_path / "n01440764").mkdir()
    for i in range(2):
        (tmp_path / f"n01440764/{i}.JPEG").write_bytes(b"")
    row_file, json_file = tmp_path / "r.csv", tmp_path / "r.json"
    for out in (row_file, json_file):
        run = run_main(capfd, "--input-flist", flist, *FAST, "--skip-bad", "--results-file", out)
        assert run.returncode == 0, run.stderr
    row = next(csv.DictReader(row_file.open()))
    assert (row["top1"], row["top1_err"], row["top5"], row["top5_err"]) == ("", "", "", "")
    assert json.loads(json_file.read_text())["top1"] is None
    assert "Accuracy (top1)=n/a (0/0, 2 failed to decode)" in run.stdout


# --- The sweep with a compiled model ----------------------------------------------------------------------


def test_the_sweeps_compiled_model_pads_a_short_batch_as_a_run_does(capfd, jpeg_set, monkeypatch):
    # 30 images in batches of 4 end in a batch of 2: the sweep ran it unpadded through the compiled
    # model, and timed its recompilation (16.9 images/s end to end against 273.9 padded).
    run, padded = ic.benchmark, []

    def recorded(loader, model, **options):
        padded.append(model.batch_size)
        return run(loader, model, **options)

    monkeypatch.setattr(ic, "benchmark", recorded)
    proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--compile",
                    "--img-size", "32", "--sweep", "batch-size=4")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert padded == [4]


# --- --warmup-batches 0 --------------------------------------------------------------------------------


@pytest.mark.parametrize("warmup", ["0", "1"])
def test_a_window_without_warm_up_says_when_its_first_batch_weighs_in_it(capfd, jpeg_set, monkeypatch, warmup):
    # --warmup-batches 0 with --compile: FPS=2.91 (40/13.73), of which the first batch (its compilation)
    # was 13 s, with no word; every other distortion of the window is warned of.
    logits, calls = ic.ModelBundle.logits, []

    def first_slow(model, images):
        calls.append(len(images))
        if len(calls) == 1:
            time.sleep(1.0)  # as a compilation (seconds) would
        return logits(model, images)

    monkeypatch.setattr(ic.ModelBundle, "logits", first_slow)
    proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *FAST, "--warmup-batches",
                    warmup)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = "WARNING: the FPS window opens at the start (no warm-up): its first batch took 1."
    assert (said in proc.stdout) == (warmup == "0"), proc.stdout


# --- --parity: what was not compared, and the run's file size limit -------------------------------------


def test_parity_counts_the_images_neither_side_decoded_and_keeps_the_runs_size_limit(tmp_path):
    # Two bad images of 4 vanished from "on 2 images" without a word; a file over --max-image-mb,
    # refused by the loader, was read by the reference (at 64 MiB) and taken for a decoder's disagreement.
    good = [write_jpeg(tmp_path / f"g{i}.JPEG", (64, 48), (200, 30, 30), seed=i) for i in range(2)]
    big = write_jpeg(tmp_path / "big.JPEG", (1200, 900), (20, 200, 30), quality=100)
    (tmp_path / "empty.JPEG").write_bytes(b"")
    (tmp_path / "text.JPEG").write_text("not an image")
    items = [(str(p), 0) for p in (*good, tmp_path / "empty.JPEG", tmp_path / "text.JPEG", big)]
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    limit = big.stat().st_size - 1
    decode = ic.get_decode_func("cpu", model.transform, policy=ic.BadImagePolicy(skip=True), max_image_bytes=limit)
    parity = ic._measure_parity(items, decode, model, batch_size=2, max_bytes=limit)
    assert (parity.images, parity.loader_only, parity.reference_only, parity.neither) == (2, 0, 0, 3)
    assert parity.summary().endswith("; 3 images neither side decoded, not compared")


# --- --loader torch: no idle worker processes --------------------------------------------------------------


def test_the_dataloaders_workers_are_capped_at_the_batches_as_decode_processes_are(jpeg_set, caplog):
    # -j 40 on 30 images in batches of 4: 40 worker processes (each an interpreter with torch) for
    # 8 batches, and a results file saying 40 workers and a loader lead of 80.
    caplog.set_level("INFO", logger=ic.__name__)
    args = ["--input-flist", str(jpeg_set), "--prefix", f"{jpeg_set.parent}/", *FAST, "--loader", "torch"]
    assert ic._preflight(ic._parse_args([*args, "-j", "40"]), ic._Shard()).num_threads == 8
    assert "--num-threads 40 capped at 8, the batches this process has." in caplog.text
    sweep = ic._preflight(ic._parse_args([*args, "--sweep", "num-threads=2,16,64"]), ic._Shard()).sweep
    assert sweep["num-threads"] == [2, 8]


# --- --trace of a run that decodes in other processes --------------------------------------------------------


def test_a_trace_of_a_run_decoding_in_worker_processes_says_the_decode_is_not_in_it(capfd, jpeg_set, tmp_path):
    # The trace (1.9 KB against 49.6 KB) held only the model's batches, and the line named both files
    # as if they held the run.
    proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *FAST, "--loader", "torch",
                    "--trace", tmp_path / "run")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "; this process only: the decode ran in worker processes, and is not in it" in proc.stderr


# --- A precision the CPU emulates -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_precision_asked_for_that_this_cpu_emulates_is_warned_of(caplog, dtype):
    # --dtype float16 on a CPU without it: 0.21 images/s against 4.90 in float32, logged as "asked for".
    native = {
        "bfloat16": torch.ops.mkldnn._is_mkldnn_bf16_supported,
        "float16": torch.ops.mkldnn._is_mkldnn_fp16_supported,
    }
    caplog.set_level("WARNING", logger=ic.__name__)
    assert ic._choose_dtype(torch.device("cpu"), dtype) == (getattr(torch, dtype), "asked for")
    said = f"This CPU lacks native {dtype}: it is emulated" in caplog.text
    assert said == (not native[dtype]())  # the hardware decides: checked, never assumed


# --- The CSV row and the plot's title say how the run decoded ----------------------------------------------


def test_the_csv_row_and_the_title_name_the_processes_and_the_stop(capfd, jpeg_set, tmp_path, monkeypatch):
    # A -j 2 --decode-processes 2 row read as a -j 2 one; a partial row did not say why; the title
    # said "x 2 threads" of the DataLoader's worker processes.
    titles = []
    monkeypatch.setattr(ic, "_plot_timeline", lambda timeline, path, title, window_name: titles.append(title))
    row_file = tmp_path / "r.csv"
    run = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *FAST, "--decode-processes",
                   "2", "--max-samples", "9", "--results-file", row_file, "--plot", tmp_path / "t.png")  # fmt: skip
    assert run.returncode == 0, run.stderr
    row = next(csv.DictReader(row_file.open()))
    assert (row["decode_processes"], row["num_threads"], row["stop_reason"]) == ("2", "2", "")
    assert "spdl ffmpeg x 2 processes x 2 threads" in titles[0]
    bad = tmp_path / "n01440764" / "bad.JPEG"
    bad.parent.mkdir()
    bad.write_bytes(b"")
    flist = tmp_path / "list.txt"
    flist.write_text("".join(f"{jpeg_set.parent}/{line}\n" for line in jpeg_set.read_text().split()[:8]) + f"{bad}\n")
    run = run_main(capfd, "--input-flist", flist, *FAST, "--loader", "torch", "--results-file", row_file, "--plot",
                   tmp_path / "t.png")  # fmt: skip
    assert run.returncode == 1, run.stderr
    row = next(csv.DictReader(row_file.open()))
    assert row["partial"] == "True" and row["stop_reason"].startswith(f"cannot decode {bad}")
    assert "torch pil x 2 workers" in titles[-1]


# --- A pipe that gives nothing for a while -----------------------------------------------------------------


def test_a_list_pipe_that_gives_nothing_for_a_while_is_said_then_read(capfd, monkeypatch):
    # (sleep 100) | imagenet-classification --input-flist -: 100 s of nothing on the screen at all.
    read_end, write_end = os.pipe()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(os.fdopen(read_end, "rb")))
    monkeypatch.setattr(ic, "_SILENT_PIPE_S", 0.2)

    def slow_writer():
        time.sleep(0.8)
        with os.fdopen(write_end, "wb") as f:
            f.write(b"val/n01440764/a.JPEG\n")

    writer = threading.Thread(target=slow_writer)
    writer.start()
    images = ic.read_file_list("-")
    writer.join()
    assert images.paths == ("val/n01440764/a.JPEG",)
    assert "note: waiting for <stdin>: nothing read in 0.2 s" in capfd.readouterr().err


# --- Starting where it cannot: no libraries, no current folder, python -OO ---------------------------------


def test_a_start_without_the_libraries_or_a_current_folder_is_one_line(tmp_path):
    # Without site-packages (python -S: another interpreter than the venv's) a ModuleNotFoundError
    # traceback; in a deleted folder, torch's import died with "Intel oneMKL FATAL ERROR", exit 2.
    script = str(ROOT / "imagenet_classification.py")
    proc = subprocess.run([sys.executable, "-S", script, "--help"], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (
        2,
        f"error: not installed for {sys.executable}: spdl, torch, torchvision, timm\n",
    )
    gone = tmp_path / "gone"
    gone.mkdir()
    shell = f'cd "{gone}" && rmdir "{gone}" && exec "{sys.executable}" "{script}" --help'
    proc = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (
        2,
        "error: the current folder no longer exists (deleted?): cd to one that does\n",
    )
    proc = subprocess.run([sys.executable, "-OO", script, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: "), proc.stderr  # was an AttributeError: no __doc__


def test_a_notebooks_ctrl_c_while_a_batch_is_counted_leaves_every_count_agreeing(jpeg_set, monkeypatch):
    # Python's own SIGINT handler (a notebook's): the KeyboardInterrupt came between the counters' updates.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    _signal_on_third_batch(monkeypatch)
    images = ic.read_file_list(jpeg_set, f"{jpeg_set.parent}/")
    decode = ic.get_decode_func("cpu", ic.EvalTransform(size=32))
    model = ic.get_model(
        "test_efficientnet", "cpu", pretrained=False, compile=False, transform=ic.EvalTransform(size=32)
    )
    batches = (decode(list(images)[i : i + 4]) for i in range(0, len(images), 4))
    with pytest.raises(ic.RunInterrupted) as stopped:
        ic.benchmark(batches, model, listed=len(images), warmup_batches=1, predictions=True)
    result = stopped.value.result
    assert result.classified == 12 and sum(result.timeline["batch_images"]) == 12 and len(result.predictions) == 12
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


# --- Review of the round: what its first fixes left -------------------------------------------------------


def _bmps(folder, count):
    return [
        str(write_jpeg(folder / f"{i}.bmp", (100 + 2 * i, 120), label_colour(0), format="BMP")) for i in range(count)
    ]


def test_the_pil_count_holds_with_worker_processes_and_counts_only_images_classified(capfd, tmp_path):
    # --decode-processes dropped the batches' counts (decoder_backends {}); a strict stop counted the
    # stopping batch's decoded images, never classified ("7 images (100.0%) decoded by PIL" of 4).
    paths = _bmps(tmp_path / "n01440764", 8)
    flist, results = tmp_path / "list.txt", tmp_path / "r.json"
    flist.write_text("\n".join(paths) + "\n")
    run = run_main(capfd, "--input-flist", flist, *FAST, "--decode-processes", "1", "--results-file", results)
    assert run.returncode == 0, run.stderr
    assert json.loads(results.read_text())["decoder_backends"] == {"ffmpeg": 0, "pil": 8}
    (tmp_path / "n01440764" / "bad.bmp").write_bytes(b"")
    flist.write_text("\n".join([*paths[:4], str(tmp_path / "n01440764" / "bad.bmp"), *paths[4:]]) + "\n")
    run = run_main(capfd, "--input-flist", flist, *FAST, "--num-threads", "1", "--results-file", results)
    assert run.returncode == 1, run.stderr
    result = json.loads(results.read_text())
    assert sum(result["decoder_backends"].values()) == result["classified"] == 4


def test_a_signal_while_a_stopping_runs_result_is_filled_gives_the_signals_status(capfd, tmp_path, monkeypatch):
    # A strict stop's result being filled when SIGTERM came: exit 1, the signal dropped unsaid.
    paths = _bmps(tmp_path / "n01440764", 4)
    (tmp_path / "n01440764" / "bad.bmp").write_bytes(b"")
    flist = tmp_path / "list.txt"
    flist.write_text("\n".join([*paths, str(tmp_path / "n01440764" / "bad.bmp")]) + "\n")
    close = ic._Loop.close

    def signalled(loop, failures):
        os.kill(os.getpid(), signal.SIGTERM)
        return close(loop, failures)

    monkeypatch.setattr(ic._Loop, "close", signalled)
    run = run_main(capfd, "--input-flist", flist, *FAST, "--num-threads", "1")
    assert run.returncode == 128 + signal.SIGTERM and "error: interrupted by SIGTERM" in run.stderr, run.stderr


def test_the_first_batch_warning_compares_it_with_the_others(capfd):
    for ends, said in (([13.0, 13.35, 13.7], True), ([0.3, 0.6, 0.9, 1.2], False)):  # the second: uniform
        result = ic.RunResult(
            listed=12,
            classified=12,
            frames_timed=12,
            elapsed_s=ends[-1],
            batches=16,
            batches_timed=16,
            timeline={"batch_end_s": ends},
        )  # fmt: skip  (16: 4 ranks' sum)
        text = io.StringIO()
        ic._print_summary(result, text)
        assert ("its first batch took" in text.getvalue()) == said, text.getvalue()


# --- A notebook's compositions -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small(jpeg_set):
    """The set's first 12 images as 3 batches of 4 at 32 pixels, and a model of that transform."""
    transform = ic.EvalTransform(size=32)
    items = list(ic.read_file_list(jpeg_set, f"{jpeg_set.parent}/"))[:12]
    decode = ic.get_decode_func("cpu", transform)
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False, transform=transform)
    return [decode(items[i : i + 4]) for i in range(0, 12, 4)], model


def test_a_model_in_training_mode_or_converted_afterwards_is_refused_before_the_run(small):
    # m.train(): batch norm used each batch's statistics and changed its own (39 buffers), unsaid;
    # m.to(bfloat16): torch's "Input type and weight type should be the same" as a model failure.
    batches, model = small
    model.train()
    try:
        with pytest.raises(ValueError, match="the model is in training mode"):
            ic.benchmark(iter(batches), model, listed=12, warmup_batches=1)
    finally:
        model.eval()
    converted = ic.ModelBundle(model.preprocessing, model.model.to(torch.bfloat16), model.classification,
                               torch.float32, model.transform)  # fmt: skip
    try:
        with pytest.raises(ValueError, match="the model's weights are torch.bfloat16, but the bundle feeds it"):
            ic.benchmark(iter(batches), converted, listed=12, warmup_batches=1)
    finally:
        model.model.to(model.dtype)  # bfloat16 where this CPU has it natively: float() was right only elsewhere


def test_a_notebook_loaders_own_error_stops_the_run_with_its_partial_result(small):
    # An OSError of the user's dataset came out raw: the 8 images classified before it were lost.
    batches, model = small

    def loader():
        yield from batches[:2]
        raise OSError("disk went away")

    with pytest.raises(ic.RunStopped, match="the loader failed: OSError: disk went away") as stopped:
        ic.benchmark(loader(), model, listed=12, warmup_batches=1)
    result = stopped.value.result
    assert (stopped.value.kind, result.classified, result.not_reached) == ("loader", 8, 4)


def test_a_loader_delivering_more_than_listed_stops_before_the_extra_images_are_counted(small):
    # 16 images of 12 listed were all classified before the end's check: classified + failed + not_reached 16.
    batches, model = small
    with pytest.raises(ic.RunStopped, match="more than the 12 listed") as stopped:
        ic.benchmark(iter([*batches, batches[0]]), model, listed=12, warmup_batches=1)
    result = stopped.value.result
    assert result.classified + result.failed + result.not_reached == 12 and result.classified == 12


def test_labels_that_are_no_whole_numbers_are_refused(small):
    # float labels were all misses (1.5), then a TypeError after the whole run with predictions=True.
    batches, model = small
    for labels in (batches[0][1].double(), batches[0][1].bool()):
        with pytest.raises(ValueError, match="labels of type torch.(float64|bool): expected whole numbers"):
            ic.benchmark(iter([(batches[0][0], labels)]), model, listed=4, warmup_batches=0, predictions=True)


def test_images_of_another_size_than_the_models_transform_are_warned_of(small):
    # Decoded at 96 for a model of 224: top-1 35 % against 95 %, unsaid.
    batches, model = small
    other = ic.get_model(
        "test_efficientnet", "cpu", pretrained=False, compile=False, transform=ic.EvalTransform(size=48)
    )
    with pytest.warns(UserWarning, match="images of 32 x 32 for a model whose transform crops 48 x 48"):
        ic.benchmark(iter(batches), other, listed=12, warmup_batches=1)


def test_a_used_up_loader_and_a_decode_function_for_processes_are_said(small, jpeg_set):
    batches, model = small
    used = iter(batches)
    ic.benchmark(used, model, listed=12, warmup_batches=1)
    with pytest.warns(ic.WarmupIncluded, match="the loader yielded none .an iterator used up already"):
        ic.benchmark(used, model, warmup_batches=1)
    items = list(ic.read_file_list(jpeg_set, f"{jpeg_set.parent}/"))[:4]
    with pytest.raises(TypeError, match="decode_func cannot be sent to the decode processes"):
        ic.get_pipeline(items, 4, ic.get_decode_func("cpu"), 1, 1, 1, decode_processes=1)
