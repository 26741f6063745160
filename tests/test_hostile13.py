"""Hostile input, round thirteen: what the sweeps of outputs, parity, torchrun and the helper scripts
found (2026-12-06). Each test fails on the code before it."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

import imagenet_classification as ic
from tests.conftest import ROOT, TINY, make_jpeg_set, read_json, run_main, write_jpeg

# --- Outputs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("cut", [["--max-samples", "4"], ["--trace", "TRACE", "--batch-size", "1"]])
def test_no_output_replaces_a_listed_image_past_the_cut(tmp_path, cut):
    # Only the first --max-samples paths (or --trace's few batches) were read, and only those were
    # checked: --results-file naming the list's 20th image replaced the user's photo with JSON.
    flist = make_jpeg_set(tmp_path, 64, sizes=((32, 24),))  # --trace: 60 batches
    victim = tmp_path / flist.read_text().splitlines()[63]  # the last, in folder order too
    before = victim.read_bytes()
    cut = [str(tmp_path / "t") if word == "TRACE" else word for word in cut]
    labelled = tmp_path / "labelled.flist"  # Caffe's val.txt form: a label column after each path
    labelled.write_text("".join(f"{line} 0\n" for line in flist.read_text().splitlines()))
    lists = [["--input-flist", str(f), "--prefix", f"{tmp_path}/"] for f in (flist, labelled)]
    for inputs in (*lists, ["--data-dir", str(tmp_path / "val")]):
        args = ic._parse_args([*inputs, *cut, "--results-file", str(victim)])
        images = ic._read_images(args)
        assert str(victim) not in images.paths
        with pytest.raises(ic.InputError, match="one of the run's inputs or outputs"):
            ic._check_files(args, images)
    assert victim.read_bytes() == before
    # A name of the list's not its own: no file of that name is listed, so the output is taken.
    args = ic._parse_args(
        ["--input-flist", str(flist), "--prefix", f"{tmp_path}/", *cut, "--results-file", str(tmp_path / "r.json")]
    )
    shutil.copy(victim, tmp_path / "r.json")
    ic._check_files(args, ic._read_images(args))


# --- Parity -----------------------------------------------------------------------------------------


class _NaNModel(torch.nn.Module):
    """Logits all NaN: topk ranks NaN first, so both sides' top 5 was classes 0-4, 'agreeing'."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full((x.shape[0], 1000), float("nan"))


def test_parity_counts_nan_logits_as_neither_agreeing_nor_correct(tmp_path):
    # Class 0 is the label here: NaN logits were "top-1 agrees on 2 of 2; top-1 correct: 2 here vs 2 there".
    paths = [write_jpeg(tmp_path / f"g{i}.JPEG", (64, 48), (200, 30, 30), seed=i) for i in range(2)]
    items = [(str(p), 0) for p in paths]
    transform = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False).transform
    model = ic.ModelBundle(
        ic.Preprocessing(transform.mean, transform.std), _NaNModel(), ic.Classification(), torch.float32, transform
    )
    decode = ic.get_decode_func("cpu", transform, policy=ic.BadImagePolicy(skip=True))
    parity = ic._measure_parity(items, decode, model, batch_size=2)
    assert (parity.images, parity.top1_agree, parity.top5_agree, parity.top1_loader, parity.top1_reference) == (
        2, 0.0, 0.0, 0.0, 0.0,
    )  # fmt: skip
    assert parity.not_finite == 2 and "2 of the 2 got NaN or infinite logits" in parity.summary()


def test_parity_with_nothing_compared_gives_no_scores_and_its_reference_keeps_the_pixel_limit(tmp_path):
    # A strip whose resize is over the pixel limit: the loader refuses it, but timm's transform resized
    # it (a 20000 x 1 strip took gigabytes) and parity said "only timm's transform decoded".
    # With no image compared, the results file's scores were 0.0: as if every prediction disagreed.
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    short = model.transform.resize_short
    strip = write_jpeg(tmp_path / "strip.JPEG", (ic.MAX_IMAGE_PIXELS // short**2 + 64, 1), (90, 90, 90))
    decode = ic.get_decode_func("cpu", model.transform, policy=ic.BadImagePolicy(skip=True))
    parity = ic._measure_parity([(str(strip), 0)], decode, model, batch_size=2)
    assert (parity.images, parity.reference_only, parity.neither) == (0, 0, 1)
    scores = ("mad_mean", "mad_max", "top1_agree", "top5_agree", "top1_loader", "top1_reference")
    assert {name: getattr(parity, name) for name in scores} == dict.fromkeys(scores)
    assert parity.summary().startswith("Parity with timm's reference transform: no image that both decoded")


# --- torchrun ---------------------------------------------------------------------------------------


def test_a_batch_stopped_at_the_warmups_barrier_keeps_its_decoder_counts():
    # The barrier that opens the FPS window (a peer stopped: RunStopped) ran before the batch's decoder
    # counts: its images counted as classified, but their backend and fallbacks were lost.
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    size = model.transform.size
    batch = ic._Batch(torch.zeros(2, 3, size, size, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.int64),
                      fallbacks=1, decoded_by={"hardware": 1, "cpu": 1})  # fmt: skip

    calls = []

    def peer_stopped() -> None:  # the run's start clock passes; the warm-up's end finds a peer stopped
        calls.append(1)
        if len(calls) == 2:
            raise ic.RunStopped("another rank stopped", "peer")

    with pytest.raises(ic.RunStopped) as stopped:
        ic.benchmark([batch], model, warmup_batches=1, sync_clocks=peer_stopped)
    result = stopped.value.result
    assert (result.classified, result.decoder_fallbacks, result.decoder_backends) == (2, 1, {"hardware": 1, "cpu": 1})


def test_a_stopped_jobs_loader_lead_is_that_of_the_ranks_it_times():
    # One rank of two timed (the other stopped in its warm-up): the slack for the batches its loader
    # held ahead was doubled, as if both loaders' leads were in the window.
    cpu = torch.device("cpu")
    past = ic.RunResult(9, classified=9, frames_timed=7, elapsed_s=0.025, batches=6, batches_timed=5, loader_lead=3)
    within = ic.RunResult(8, classified=2, frames_timed=2, elapsed_s=0.015, batches=1, batches_timed=1,
                          warmup_included=True, partial=True, loader_lead=3)  # fmt: skip
    job = ic._job_total([ic._rank_share(past, 0, cpu), ic._rank_share(within, 1, cpu)], 17, past)
    assert job.loader_lead == 3


def test_a_rank_that_ends_later_than_the_timeout_is_waited_for(tmp_path):
    # Rank 1's images are large, rank 0's small: rank 0 ended seconds first and its final gather gave
    # up after --timeout, failing a healthy job ("another rank stopped"). --timeout is the most
    # seconds without a batch: a rank still classifying is waited for.
    big = write_jpeg(tmp_path / "big.JPEG", (4000, 3000), (90, 120, 150))
    small = [write_jpeg(tmp_path / f"s{i}.JPEG", (64, 48), (200, 30, 30), seed=i) for i in range(64)]
    lines = [f"{p} n01440764" for pair in zip(small, [big] * 64, strict=True) for p in pair]  # odd lines: rank 1
    flist = tmp_path / "uneven.flist"
    flist.write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.json"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd = [*launcher, str(ROOT / "imagenet_classification.py"), "--input-flist", str(flist), *TINY, "--num-threads",
           "1", "--no-compile", "--batch-size", "4", "--warmup-batches", "0", "--timeout", "2", "--results-file",
           str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    result = read_json(out)
    assert (result["classified"], result["partial"]) == (128, False)
    assert max(r["elapsed_s"] for r in result["ranks"]) - min(r["elapsed_s"] for r in result["ranks"]) > 2


# --- A sweep that stopped ---------------------------------------------------------------------------


def test_a_sweep_that_stopped_recommends_nothing(tmp_path):
    # Stopped after two of its settings, the sweep still printed "The smallest setting within 5 % of the
    # best" and a command line, wrote recommended=True in its CSV and circled it in the plot.
    points = [ic._SweepPoint(1, 8, 4, 100.0, 300.0), ic._SweepPoint(2, 8, 4, 190.0, 300.0)]
    sweep = ic._Sweep(points, 64, error=ic.RunStopped("no batch for 2 s (--timeout)", "stalled"))
    assert sweep.recommended is None and sweep.to_dict()["recommended"] is None
    out = io.StringIO()
    ic._print_sweep(sweep, ["imagenet_classification.py", "--input-flist", "l"], out)
    assert "No setting to recommend: the sweep stopped before it measured them all" in out.getvalue()
    assert "--num-threads" not in out.getvalue()
    ic._write_sweep(tmp_path / "s.csv", sweep, {})
    rows = list(csv.DictReader((tmp_path / "s.csv").open()))
    assert [(row["recommended"], row["partial"]) for row in rows] == [("False", "True")] * 2  # the CSV alone says it


def test_a_plot_title_with_a_dollar_sign_is_drawn_as_typed(tmp_path):
    # A model from a folder named with a $ (local-dir:/models/$v2^$) put mathtext in the title: the plot
    # raised ValueError and was lost, with an empty reason ("not written (ValueError: ; ...").
    points = [ic._SweepPoint(1, 8, 4, 100.0, 300.0), ic._SweepPoint(2, 8, 4, 190.0, 300.0)]
    assert ic._plot_sweep(ic._Sweep(points, 64), tmp_path / "s.png", "Sweep of local-dir:/models/$v2^$ on cpu")
    window = ic._TimingWindow(torch.device("cpu"), warmup_batches=1)
    for _ in range(3):
        window.add(4)
    window.close()
    assert ic._plot_timeline(window.timeline(), tmp_path / "t.png", "local-dir:/m/$x^$ on cpu\nFPS 1.0")
    assert (tmp_path / "s.png").stat().st_size and (tmp_path / "t.png").stat().st_size


def test_a_file_not_written_says_the_first_line_of_its_reason_that_has_words(tmp_path, capsys):
    def mathtext(path):
        raise ValueError("\nv2^\n   ^\nParseFatalException: Expected token")

    assert ic._write_outputs([("the plot", tmp_path / "p.png", mathtext)]) == [
        f"{tmp_path / 'p.png'}: not written (ValueError: v2^; --debug shows where)"
    ]


def test_a_time_out_after_every_listed_image_is_the_loaders_end():
    # SPDL's iterator time-out covers the wait for the stream's end too: with --timeout 0.05 a run that
    # had classified all 8 of 8 images stopped as "no batch for 0.05 s" and was marked PARTIAL RUN.
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    size = model.transform.size

    def loader(batches: int):
        for _ in range(batches):
            yield ic._Batch(torch.zeros(4, 3, size, size, dtype=torch.uint8), torch.zeros(4, 1, dtype=torch.int64))
        raise TimeoutError  # as SPDL's get_iterator(timeout=...) raises it

    result = ic.benchmark(loader(2), model, listed=8, warmup_batches=0)
    assert (result.classified, result.partial) == (8, False)
    with pytest.raises(ic.RunStopped, match="no batch within the loader's time-out") as stopped:
        ic.benchmark(loader(1), model, listed=8, warmup_batches=0)  # 4 of 8: a stall
    assert stopped.value.kind == "stalled" and stopped.value.result.classified == 4


def test_no_sink_queue_verdict_without_an_image_in_the_fps_window():
    # Every image failed: the sink's one get in the window was the stream's end, waited for, and the
    # summary said "the model waited for batches: loading is the bottleneck".
    stats = {"stages": [], "sink_queue": {"items": 1, "occupancy": 0.0, "ave_get_wait_s": 0.2}}
    report = ic._RunReport(ic.RunResult(listed=4, failed=4), {}, {}, [], pipeline_stats=stats)
    out = io.StringIO()
    ic._print_report(report, out)
    assert "SPDL sink queue: no batch was taken in the FPS window" in out.getvalue()
    assert "bottleneck" not in out.getvalue()


def test_trace_may_name_a_folder_beside_which_its_two_files_go(tmp_path, jpeg_set):
    # --trace runs/t writes runs/t.json and runs/t.pftrace: a folder runs/t, never written, was refused
    # as "not a regular file".
    (tmp_path / "t").mkdir()
    args = ic._parse_args(
        ["--input-flist", str(jpeg_set), "--prefix", f"{jpeg_set.parent}/", "--trace", str(tmp_path / "t")]
    )
    ic._check_files(args, ic._read_images(args))
    (tmp_path / "t.json").mkdir()  # one of its files: refused
    with pytest.raises(ic.InputError, match="t.json: not a regular file"):
        ic._check_files(args, ic._read_images(args))


# --- The decoder check ------------------------------------------------------------------------------


def test_the_decoder_check_counts_what_one_side_alone_decoded_and_each_path_once(tmp_path):
    # An image listed twice was compared twice; an image only the checked decoder took (here: over the
    # run's --max-image-mb, which the reference ignored) or that neither took vanished without a count,
    # and a check that compared nothing gave differences of 0.0, as if perfect.
    transform = ic.EvalTransform()
    small = write_jpeg(tmp_path / "small.JPEG", (64, 48), (200, 30, 30))
    big = write_jpeg(tmp_path / "big.JPEG", (900, 700), (20, 200, 30), quality=100)
    (tmp_path / "text.JPEG").write_text("not an image")
    limit = big.stat().st_size - 1
    items = [(str(small), 0), (str(small), 0), (str(big), 1), (str(tmp_path / "text.JPEG"), 2)]
    permissive = ic.get_decode_func("cpu", transform)  # no limit of the run's: it decodes big.JPEG
    check = ic._check_decoder(permissive, items, transform, "ffmpeg", max_image_bytes=limit)
    assert (check.images, check.only_decoder, check.only_reference, check.neither) == (1, 1, 0, 1)
    nothing = ic._check_decoder(permissive, items[3:], transform, "ffmpeg", max_image_bytes=limit)
    assert (nothing.images, nothing.mad_mean, nothing.mad_max, nothing.neither) == (0, None, None, 1)


def test_parity_spreads_its_sample_over_the_list_and_says_when_it_has_fewer_than_asked(tmp_path, capfd):
    # The sample was the list's first N: in a list sorted by class, one class (here: the first four,
    # all unreadable, so nothing compared). Asked for more than the list holds, it said nothing.
    flist = make_jpeg_set(tmp_path, 8, sizes=((64, 48),))
    lines = sorted(flist.read_text().splitlines(), key=lambda line: line.split("/")[1])  # by class
    for line in lines[:4]:
        (tmp_path / line).write_text("not an image")
    flist.write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.json"
    common = ["--input-flist", flist, "--prefix", f"{tmp_path}/", *TINY, "--no-compile", "--skip-bad"]
    proc = run_main(capfd, *common, "--parity", "2", "--results-file", out)
    assert proc.returncode == 0, proc.stderr
    parity = read_json(out)["parity"]
    assert (parity["images"], parity["neither"], parity["requested"]) == (1, 1, 2)
    proc = run_main(capfd, *common, "--parity", "50", "--results-file", out)
    parity = read_json(out)["parity"]
    assert (parity["images"], parity["neither"], parity["requested"]) == (4, 4, 50)
    assert "; 50 asked for, the list has no more distinct images" in proc.stdout


def test_parity_names_the_16_bit_images_its_reference_clips(tmp_path):
    # A 16-bit grey PNG: PIL's convert("RGB") clips its samples to 255 (white), FFmpeg scales them, and
    # the difference was shown as the loader's.
    import numpy as np
    from PIL import Image

    ramp = (np.linspace(0, 60000, 64 * 48).reshape(48, 64)).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "deep.png")
    model = ic.get_model("test_efficientnet", "cpu", pretrained=False, compile=False)
    decode = ic.get_decode_func("cpu", model.transform, policy=ic.BadImagePolicy(skip=True))
    parity = ic._measure_parity([(str(tmp_path / "deep.png"), 0)], decode, model)
    assert parity.images == 1 and parity.deep == [str(tmp_path / "deep.png")] and parity.mad_max > 50
    assert "1 image of 16 bits per sample, which timm's reference clips" in parity.summary()


def test_a_jobs_plot_title_says_its_curve_is_rank_0s():
    # Under torchrun the title gave the job's FPS and accuracy over rank 0's timeline, unlabelled.
    config = {"compile": None, "num_threads": 2, "loader": "spdl", "decode_processes": 0, "batch_size": 4,
              "decoder": "ffmpeg", "model": "m", "device": "cpu", "dtype": "float32"}  # fmt: skip
    result = ic.RunResult(listed=8, classified=8, frames_timed=8, elapsed_s=1.0)
    job = ic._RunReport(result, config, {}, [{"rank": 0}, {"rank": 1}])
    assert ic._run_title(job).endswith(", 2 ranks: the job's figures; the curve is rank 0's")
    assert "rank" not in ic._run_title(ic._RunReport(result, config, {}, [{"rank": 0}]))
    result.partial = True  # a stopped run's plot says so, as its summary does
    assert ic._run_title(ic._RunReport(result, config, {}, [{"rank": 0}])).endswith(" (PARTIAL RUN)")


def test_random_weights_are_the_same_in_every_run(jpeg_set, tmp_path, capfd):
    # --no-pretrained drew new weights in each process: two runs (or two torchrun ranks) classified
    # with different models.
    rows = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.jsonl"
        proc = run_main(capfd, "--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--no-compile",
                        "--max-samples", "4", "--predictions-file", out)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        rows.append([json.loads(line)["top5"] for line in out.read_text().splitlines()])
    assert rows[0] == rows[1]


def test_the_loaders_time_out_after_its_last_image_ends_it_for_every_pass():
    # The sweep's and the breakdown's loader-alone passes iterate the loader without benchmark: there
    # a time-out waiting for the stream's end stopped a complete pass as stalled.
    def batches(count: int):
        for _ in range(count):
            yield ic._Batch(torch.zeros(3, 3, 8, 8, dtype=torch.uint8), torch.zeros(3, 1, dtype=torch.int64),
                            failures=[ic.ImageDecodeError("bad.JPEG", "not an image")])  # fmt: skip
        raise TimeoutError

    assert len(list(ic._ending_once_complete(batches(2), listed=8))) == 2  # 6 classified, 2 failed: all 8
    with pytest.raises(TimeoutError):
        list(ic._ending_once_complete(batches(1), listed=8))  # 4 of 8: a stall


def test_a_stalled_loader_alone_is_a_run_stopped_not_a_traceback():
    # The breakdown's and the sweep's loader-alone passes let a time-out (or SPDL's PipelineFailure, an
    # ExceptionGroup) through measure_loader raw: the run's finished report was lost to a traceback.
    def stalls():
        yield ic._Batch(torch.zeros(2, 3, 8, 8, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.int64))
        raise TimeoutError

    with pytest.raises(ic.RunStopped, match="no batch within the loader's time-out") as stopped:
        ic.measure_loader(stalls(), "cpu", warmup_batches=0)
    assert stopped.value.kind == "stalled"


@pytest.mark.parametrize("frozen", [1, 0])
def test_a_frozen_rank_is_given_up_on_not_waited_for_forever(tmp_path, frozen):
    # The rank that ends first waits for the others while their heartbeat goes on: one frozen
    # (SIGSTOP: its heartbeat stops too) must stop the job at --timeout + 2 s, not hang it. Frozen
    # rank 0 holds the job's store (no torchrun agent here): each call to it waited forever, then,
    # bounded, twice or three times --timeout + 2 s (the share posted before the wait and after it).
    timeout = 3 if frozen == 1 else 8  # 10 s of silence: a second wait for the store stands out
    big = write_jpeg(tmp_path / "big.JPEG", (4000, 3000), (90, 120, 150))
    small = [write_jpeg(tmp_path / f"s{i}.JPEG", (64, 48), (200, 30, 30), seed=i) for i in range(64)]
    pairs = zip(small, [big] * 64, strict=True) if frozen == 1 else zip([big] * 64, small, strict=True)
    lines = [f"{p} n01440764" for pair in pairs for p in pair] * 4  # the frozen rank's: the large images
    flist = tmp_path / "uneven.flist"
    flist.write_text("\n".join(lines) + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        cmd = [sys.executable, str(ROOT / "imagenet_classification.py"), "--input-flist", str(flist), *TINY,
               "--num-threads", "1", "--no-compile", "--batch-size", "4", "--warmup-batches", "0", "--timeout",
               str(timeout)]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        while "Page cache:" not in (line := procs[0].stderr.readline()):  # both ranks joined and agreed
            assert line or procs[0].poll() is None
        time.sleep(2)  # both past the barrier that opens the window; the large images have seconds left
        waiting = procs[1 - frozen]
        procs[frozen].send_signal(signal.SIGSTOP)
        started = time.monotonic()
        stdout, stderr = waiting.communicate(timeout=90)
        elapsed = time.monotonic() - started
        assert waiting.returncode == 1 and elapsed < (60 if frozen == 1 else timeout + 2 + 6), (elapsed, stderr)
        assert f"error: rank {1 - frozen}: another rank stopped" in stderr and "Traceback" not in stderr
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()
