"""Every number the benchmark reports, pinned to a value computed here, not by the module.

- Accuracy: a real timm model (``test_efficientnet``) whose classifier weights are zero and whose
  bias ranks the classes in a fixed order, so every image's logits put class 281 first, class
  636 fifth and class 967 sixth; the file list decides which label lands at which rank.
- Timing: a loader (a generator of real tensors) whose warm-up batches sleep 1 s and whose timed
  batches sleep 0.05 s, so a window that took in any of the warm-up is seconds too long.
- The bad-image policy at ``--max-bad``'s boundary, for N and for P%, with every bad image in
  the first batch, so that where the run stops does not depend on the loader's timing.
- Geometry against timm's own evaluation transform (torchvision's Resize and CenterCrop).
- Shards and per-rank figures under torchrun.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import timm
import timm.data
import torch
from PIL import Image
from spdl.pipeline import PipelineFailure

from imagenet_classification import (
    BadImagePolicy,
    Classification,
    EvalTransform,
    ImageDecodeError,
    ModelBundle,
    Preprocessing,
    RunResult,
    RunStopped,
    _Batch,
    _Breakdown,
    _decode_items,
    _in_seconds,
    _loader_failed,
    _measure_model,
    _oldest_in_progress,
    _print_breakdown,
    _print_summary,
    _resize_region,
    _RunReport,
    _Shard,
    _TimingWindow,
    _working_on,
    _write_results,
    benchmark,
    get_decode_func,
    main,
    measure_loader,
    source,
)
from tests.conftest import CLASSES, ROOT, read_json, run_cli, run_main, write_jpeg

# Classes by rank, 1 first: every image's logits order them so (the rest come after, class 0 last).
RANKING = [281, 1, 2, 3, 636, 967]
AT_RANK_1, AT_RANK_2, AT_RANK_5, AT_RANK_6, LAST = 281, 1, 636, 967, 0
WNID = {index: wnid for wnid, index in CLASSES.items()} | {1: "n01443537"}  # class 1: goldfish

# The 17 good images' labels, in list order: 4 at rank 1, 1 at rank 2, 5 at rank 5, 6 at rank 6, 1 last.
GOOD_LABELS = [281, 636, 967, 0, 281, 636, 967, 636, 967, 281, 636, 967, 1, 967, 281, 636, 967]
TOP1_HITS = GOOD_LABELS.count(AT_RANK_1)  # 4
TOP5_HITS = TOP1_HITS + GOOD_LABELS.count(AT_RANK_2) + GOOD_LABELS.count(AT_RANK_5)  # 10: rank 6 is one past
BAD = 3  # bad images, all in the first batch of 4 (lines 2-4), after one good image

# One decode thread: SPDL hands over batches as they complete, so with two a short batch could
# overtake a full one and the warm-up (the first batch to arrive) would vary from run to run.
RUN = ["--model", "test_efficientnet", "--device", "cpu", "--num-threads", "1", "--no-compile", "--no-bf16",
       "--batch-size", "4", "--warmup-batches", "1"]  # fmt: skip


def _ranking_bias(ranking: list[int] = RANKING, last: int = LAST) -> torch.Tensor:
    """Logits that put ``ranking`` first, in its order, then the other classes, then ``last``."""
    bias = torch.zeros(1000)
    bias[ranking] = torch.arange(len(ranking), 0, -1, dtype=torch.float32)  # 6, 5, ..., 1; the rest 0
    bias[last] = -1.0
    return bias


@pytest.fixture(scope="module")
def ranked_checkpoint(tmp_path_factory) -> Path:
    """test_efficientnet weights whose logits are the ranking bias, whatever the image."""
    model = timm.create_model("test_efficientnet", pretrained=False)
    state = model.state_dict()
    state["classifier.weight"] = torch.zeros_like(state["classifier.weight"])
    state["classifier.bias"] = _ranking_bias()
    path = tmp_path_factory.mktemp("ranked") / "ranked.pth"
    torch.save(state, path)
    # The premise, checked on the real model: top 6 in RANKING's order, class 0 last.
    model.load_state_dict(state)
    with torch.inference_mode():
        logits = model.eval()(torch.randn(2, 3, 160, 160))
    assert logits.topk(6).indices.tolist() == [RANKING] * 2 and logits.argmin(dim=1).tolist() == [LAST] * 2
    return path


@pytest.fixture(scope="module")
def ranked_set(tmp_path_factory) -> Path:
    """20 lines: a good image, 3 bad ones (empty, not an image, truncated), 16 more good ones.

    Returns the list of all 20 (``all.flist``); ``good.flist`` beside it lists the 17 good ones.
    """
    root = tmp_path_factory.mktemp("ranked_set")
    good = []
    for i, label in enumerate(GOOD_LABELS):
        rel = f"val/{WNID[label]}/good_{i:02d}.JPEG"
        write_jpeg(root / rel, ((200, 150), (150, 200), (180, 180))[i % 3], (90, 120, 60), seed=i)
        good.append(rel)
    bad = [f"val/{WNID[0]}/{name}.JPEG" for name in ("empty", "text", "truncated")]
    (root / bad[0]).write_bytes(b"")
    (root / bad[1]).write_text("<html>not an image</html>\n" * 20)
    jpeg = (root / good[0]).read_bytes()
    (root / bad[2]).write_bytes(jpeg[: len(jpeg) // 2])
    (root / "all.flist").write_text("\n".join([good[0], *bad, *good[1:]]) + "\n")
    (root / "good.flist").write_text("\n".join(good) + "\n")
    return root / "all.flist"


def _run_ranked(flist: Path, checkpoint: Path, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_cli("--input-flist", flist, "--prefix", f"{flist.parent}/", *RUN, "--checkpoint", checkpoint, *args,
                   timeout=timeout)  # fmt: skip


# --- Accuracy, timing and accounting of a whole run, through the CLI ---------------------------


def test_a_run_at_the_max_bad_limit_reports_exact_figures(ranked_set, ranked_checkpoint, tmp_path, capfd):
    out = tmp_path / "r.json"  # in this process: the figures reported are checked, not the process
    proc = run_main(capfd, "--input-flist", ranked_set, "--prefix", f"{ranked_set.parent}/", *RUN, "--checkpoint",
                    ranked_checkpoint, "--skip-bad", "--max-bad", str(BAD), "--breakdown",
                    "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # exactly at the limit: 3 failed, 3 allowed
    r = read_json(out)
    classified = len(GOOD_LABELS)
    assert (r["listed"], r["classified"], r["failed"], r["not_reached"]) == (20, classified, BAD, 0)
    assert (r["top1_correct"], r["top5_correct"]) == (TOP1_HITS, TOP5_HITS)
    assert r["top1"] == TOP1_HITS / classified and r["top5"] == TOP5_HITS / classified
    assert r["partial"] is False and r["stop_reason"] is None and r["decoder_fallbacks"] == 0
    assert sorted(Path(f["path"]).stem for f in r["failures"]) == ["empty", "text", "truncated"]
    # Batches of 1 (the first batch's survivor), 4, 4, 4, 4: the warm-up batch is the first.
    assert (r["batches"], r["frames_timed"], r["warmup_included"]) == (5, 16, False)
    assert r["fps"] == 16 / r["elapsed_s"] and r["elapsed_s"] > 0
    lines = proc.stdout.splitlines()
    assert f"FPS={r['fps']:.2f} (16/{_in_seconds(r['elapsed_s'])})" in lines
    assert "Accuracy (top1)=23.53% (4/17, 3 failed to decode)" in lines
    assert "Accuracy (top5)=58.82% (10/17, 3 failed to decode)" in lines
    assert "Images: listed=20 classified=17 failed=3 not_reached=0" in lines
    # The breakdown: the bound is the slower side; on the CPU, the rate of taking turns, by hand.
    b = r["breakdown"]
    assert b["e2e_fps"] == r["fps"] and b["loader_fps"] > 0 and b["model_fps"] > 0
    bound = min(b["loader_fps"], b["model_fps"])
    shared = b["loader_fps"] * b["model_fps"] / (b["loader_fps"] + b["model_fps"])
    assert b["bound_fps"] == bound and b["shared_fps"] == pytest.approx(shared, rel=1e-12)
    assert b["efficiency"] == pytest.approx(r["fps"] / bound, rel=1e-12)
    assert b["bottleneck"] == ("loader" if b["loader_fps"] < b["model_fps"] else "model")
    assert (f"Breakdown (images/s): loader alone {b['loader_fps']:.1f} | model alone {b['model_fps']:.1f} | "
            f"end-to-end {r['fps']:.1f}") in lines  # fmt: skip
    noise = (
        " (above 100 %: measurement noise, or a window too short for the loader's buffer or its drain)"
        if b["efficiency"] > 1
        else ""
    )
    assert (f"Bound {b['bound_fps']:.1f} images/s, set by the {b['bottleneck']}; end-to-end reaches "
            f"{b['efficiency']:.0%} of it{noise}") in lines  # fmt: skip
    assert (f"On the CPU the two share the cores: taking turns, with no overlap, they would reach "
            f"{shared:.1f} images/s") in lines  # fmt: skip


@pytest.mark.parametrize("rows_file", ["p.jsonl", "p.csv"])
def test_a_checkpoint_that_gives_nan_counts_no_hit_and_says_so(ranked_set, ranked_checkpoint, tmp_path, capfd,
                                                                rows_file):  # fmt: skip
    # A diverged training run's weights: one NaN in the classifier's bias, so every image's
    # logits hold a NaN, while topk still ranks RANKING's classes among the first.
    state = torch.load(ranked_checkpoint, weights_only=True)
    state["classifier.bias"][5] = math.nan
    torch.save(state, diverged := tmp_path / "diverged.pth")
    out, rows = tmp_path / "r.json", tmp_path / rows_file
    good = ranked_set.parent / "good.flist"
    proc = run_main(capfd, "--input-flist", good, "--prefix", f"{good.parent}/", *RUN, "--checkpoint", diverged,
                    "--results-file", out, "--predictions-file", rows)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = read_json(out)
    assert (r["classified"], r["top1_correct"], r["top5_correct"], r["not_finite"]) == (17, 0, 0, 17)
    assert "WARNING: 17 of the 17 images classified got NaN or infinite logits" in proc.stdout
    if rows_file.endswith(".csv"):
        table = list(csv.DictReader(rows.open()))
        assert len(table) == 17
        assert {(row["probs"], row["correct1"], row["correct5"]) for row in table} == {("", "0", "0")}
    else:
        lines = rows.read_text().splitlines()
        assert len(lines) == 17 and all(json.loads(line)["probs"] is None for line in lines)  # valid JSON: no NaN


@pytest.mark.parametrize("max_bad", ["2", "14.99%"], ids=["N", "percent"])
def test_one_past_the_max_bad_limit_stops_at_the_first_batch(ranked_set, ranked_checkpoint, tmp_path, max_bad):
    # 2, and 14.99% of 20 = 2.998 images, rounded down: 2 allowed, 3 failed. Every bad image is in
    # the first batch, so the run stops as that batch arrives, before any image is classified.
    out = tmp_path / "r.json"
    proc = _run_ranked(ranked_set, ranked_checkpoint, "--skip-bad", "--max-bad", max_bad, "--results-file", out)
    assert proc.returncode == 1, proc.stderr
    assert "error: 3 images failed to decode, more than --max-bad allows (2)" in proc.stderr
    r = read_json(out)
    assert (r["listed"], r["classified"], r["failed"], r["not_reached"], r["partial"]) == (20, 0, 3, 17, True)
    assert (r["top1_correct"], r["top5_correct"], r["top1"], r["top5"]) == (0, 0, None, None)  # no accuracy of nothing
    assert "Images: listed=20 classified=0 failed=3 not_reached=17 (PARTIAL RUN)" in proc.stdout.splitlines()


def test_exactly_at_the_max_bad_percentage_goes_on(ranked_set, ranked_checkpoint, tmp_path, capfd):
    out = tmp_path / "r.json"  # in this process: the figures reported are checked, not the process
    proc = run_main(capfd, "--input-flist", ranked_set, "--prefix", f"{ranked_set.parent}/", *RUN, "--checkpoint",
                    ranked_checkpoint, "--skip-bad", "--max-bad", "15%", "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # 15% of 20 = 3 images allowed, 3 failed
    r = read_json(out)
    assert (r["classified"], r["failed"], r["not_reached"], r["top5_correct"]) == (17, 3, 0, TOP5_HITS)


def test_bad_image_policy_bookkeeping_by_hand():
    # A limit without skipping is a mistake in the caller's code, refused at once.
    for limits in ({"max_bad": 3}, {"max_bad_percent": 10.0}):
        with pytest.raises(ValueError, match="only when they are skipped"):
            BadImagePolicy(**limits)
    with pytest.raises(ValueError, match="not both"):
        BadImagePolicy(skip=True, max_bad=3, max_bad_percent=10.0)
    # Limits that would stop at the first bad image, never, or with a TypeError mid-run.
    for limits in ({"max_bad": -1}, {"max_bad": "3"}, {"max_bad": 2.5}, {"max_bad": True}):
        with pytest.raises(ValueError, match=r"max_bad=.*: expected a whole number of images, 0 or more"):
            BadImagePolicy(skip=True, **limits)
    for percent in (-5, 150, float("nan"), "10"):
        with pytest.raises(ValueError, match=r"max_bad_percent=.*: expected a number from 0 to 100"):
            BadImagePolicy(skip=True, max_bad_percent=percent)
    assert BadImagePolicy(skip=True, max_bad=0).max_bad == 0 and BadImagePolicy(skip=True, max_bad_percent=100)
    policy = BadImagePolicy(skip=True)
    # The first error that is not an image's fault is the one the run's error names: each carries
    # its image's path, and SPDL raises each failed stage's error from the first of them.
    stage_errors = []
    for path, cause in (("a.JPEG", MemoryError()), ("b.JPEG", RuntimeError())):
        cause._while_decoding = path
        try:
            raise RuntimeError("The pipeline stage (decode) failed 1 times") from cause
        except RuntimeError as e:
            stage_errors.append(e)
    stopped = _loader_failed(PipelineFailure([("decode", stage_errors[0]), ("other", stage_errors[1])]))
    assert "out of memory while decoding a.JPEG" in str(stopped)
    # A --decode-processes worker's death, as SPDL's pool monitor reports it (the kill itself: test_processes).
    from concurrent.futures import BrokenExecutor

    try:
        raise RuntimeError("The pipeline stage (decode) failed 1 times") from BrokenExecutor("A worker process exited")
    except RuntimeError as e:
        stopped = _loader_failed(PipelineFailure([("decode", e)]))
    assert str(stopped).startswith("the loading pipeline failed: a --decode-processes worker died (BrokenExecutor: ")
    # A stalled run names the image in progress for the longest time, and for how long.
    assert _oldest_in_progress() is None
    entered, release = [threading.Event(), threading.Event()], threading.Event()

    def work(path: str, i: int) -> None:
        with _working_on(path):
            entered[i].set()
            release.wait(10)

    threads = [threading.Thread(target=work, args=("slow.JPEG", 0))]
    threads[0].start()
    entered[0].wait(10)
    time.sleep(0.3)
    threads.append(threading.Thread(target=work, args=("later.JPEG", 1)))
    threads[1].start()
    entered[1].wait(10)
    path, seconds = _oldest_in_progress()
    release.set()
    for thread in threads:
        thread.join()
    assert path == "slow.JPEG" and 0.3 <= seconds < 5
    assert _oldest_in_progress() is None  # each thread's mark is gone once it is done
    # The decode loop marks each image as its thread's while it decodes it.
    marked = []
    _decode_items([("ok.JPEG", 0)], lambda path: marked.append(_oldest_in_progress()[0]), policy, [])
    assert marked == ["ok.JPEG"] and _oldest_in_progress() is None
    # An error that is not the image's fault, in a decode function with a policy: raised, and named.
    failures = []
    with pytest.raises(ZeroDivisionError) as info:
        _decode_items([("ok.JPEG", 0), ("bug.JPEG", 1)], lambda path: 1 / (path == "ok.JPEG"), policy, failures)
    assert info.value._while_decoding == "bug.JPEG" and failures == []


@pytest.mark.parametrize(
    "value, accepted",
    [("0", True), ("101", True), ("0%", True), ("100%", True), ("-1", False), ("-5%", False), ("-0.5%", False),
     ("100.5%", False), ("2.5", False), ("x%", False)],
)  # fmt: skip
def test_max_bad_values_accepted_and_refused(tmp_path, capsys, value, accepted):
    # In-process and cheap: an accepted value goes on to the file-list check, which stops the run.
    try:
        status = main(["--input-flist", str(tmp_path / "none.flist"), "--skip-bad", f"--max-bad={value}"])
    except SystemExit as e:  # argparse refused it
        status = e.code
    assert status == 2
    err = capsys.readouterr().err
    assert ("none.flist: no such file" in err) is accepted and ("argument --max-bad" in err) is not accepted, err


# --- Per-rank figures under torchrun ------------------------------------------------------------


@pytest.mark.parametrize(
    "listed, batch_size, warmup, classified, timed, warmup_included",
    [(17, 4, 2, (9, 8), (9, 8), True), (16, 7, 1, (8, 8), (1, 1), False)],
    ids=["shortest-shard-within-the-warmup", "warmup-left-out"],
)
def test_torchrun_per_rank_figures(
    ranked_set, ranked_checkpoint, tmp_path, listed, batch_size, warmup, classified, timed, warmup_included
):
    # Rank 0 takes lines 0, 2, 4, ..., rank 1 lines 1, 3, 5, ... 17 images in batches of 4 with a
    # warm-up of 2: rank 1 has 2 batches, no more than the warm-up, so every rank times all of its
    # batches (a barrier at the warm-up's end would wait for ever). 16 images in batches of 7 with
    # a warm-up of 1: each rank has 2 batches, 7 images and 1, and times its last.
    flist, out = ranked_set.with_name("good.flist"), tmp_path / "r.json"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    args = ["--input-flist", flist, "--prefix", f"{flist.parent}/", *RUN, "--checkpoint", ranked_checkpoint,
            "--max-samples", listed, "--batch-size", batch_size, "--warmup-batches", warmup, "--timeout", "30",
            "--results-file", out]  # fmt: skip
    cmd = [*launcher, str(ROOT / "imagenet_classification.py"), *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    r = read_json(out)
    ranks = {entry["rank"]: entry for entry in r["ranks"]}
    assert r["world_size"] == 2 and sorted(ranks) == [0, 1]
    assert (ranks[0]["classified"], ranks[1]["classified"]) == classified
    assert all(entry["device"] == "cpu" and entry["elapsed_s"] > 0 for entry in ranks.values())
    for rank, entry in ranks.items():
        assert entry["fps"] == pytest.approx(timed[rank] / entry["elapsed_s"], rel=1e-12)
    top1, top5 = TOP1_HITS, TOP5_HITS  # GOOD_LABELS[16], left out of 16, is at rank 6: no hit
    assert (r["listed"], r["classified"], r["failed"], r["not_reached"]) == (listed, listed, 0, 0)
    assert (r["top1_correct"], r["top5_correct"], r["top1"], r["top5"]) == (top1, top5, top1 / listed, top5 / listed)
    assert (r["frames_timed"], r["warmup_included"], r["partial"]) == (sum(timed), warmup_included, False)
    assert r["batches"] == sum(math.ceil(n / batch_size) for n in classified)
    assert r["elapsed_s"] == max(entry["elapsed_s"] for entry in ranks.values())
    assert r["fps"] == sum(timed) / r["elapsed_s"]
    per_rank = [math.ceil(n / batch_size) - (0 if warmup_included else warmup) for n in classified]
    # Each rank's loader holds queue 16 + 1 thread's batches + 1 ahead; never more than the window has.
    assert (r["batches_timed"], r["loader_lead"]) == (sum(per_rank), min(2 * (16 + 3 + 1), sum(per_rank)))
    lines = proc.stdout.splitlines()  # rank 0 alone prints the job's summary
    assert lines.count(f"Images: listed={listed} classified={listed} failed=0 not_reached=0") == 1
    assert f"Accuracy (top1)={100 * top1 / listed:.2f}% ({top1}/{listed})" in lines
    assert f"Accuracy (top5)={100 * top5 / listed:.2f}% ({top5}/{listed})" in lines


REDUCE_ONE_RANK = """
import json, os
import torch
import imagenet_classification as ic
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{port}", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
ic._init_distributed(torch.device("cpu"), 60)
result = ic.RunResult(listed=5, classified=3, failed=2, frames_timed=3, elapsed_s=1.0, batches=6, batches_timed=5,
                      loader_lead=4, decoder_backends={{"hardware": 2, "cpu": 1}})
result.record_failures([ic.ImageDecodeError("a.JPEG", "empty"), ic.ImageDecodeError("b.JPEG", "cut")])
result.predictions = [dict(path="c.JPEG", top1=1)]
total, ranks = ic._reduce_results(result, ic._Shard(0, 1, 0), torch.device("cpu"))
torch.distributed.destroy_process_group()  # as _run_job does: left to shutdown, Gloo's threads may abort the process
print(json.dumps(dict(failures=total.failures, predictions=total.predictions, lead=total.loader_lead,
                      timed=total.batches_timed, ranks=ranks, listed=total.listed, backends=total.decoder_backends)))
"""


def test_reduce_results_keeps_failures_predictions_and_the_lead(tmp_path):
    # One Gloo rank in a process of its own: what reduce_results gathers comes back whole.
    code = REDUCE_ONE_RANK.format(port=29500 + os.getpid() % 500)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["failures"] == [{"path": "a.JPEG", "reason": "empty"}, {"path": "b.JPEG", "reason": "cut"}]
    assert (out["predictions"], out["lead"], out["timed"]) == ([{"path": "c.JPEG", "top1": 1}], 4, 5)
    assert out["ranks"] == [{"rank": 0, "classified": 3, "fps": 3.0, "elapsed_s": 1.0, "device": "cpu"}]
    assert (out["listed"], out["backends"]) == (5, {"hardware": 2, "cpu": 1})


# --- Shards -------------------------------------------------------------------------------------


def test_each_rank_takes_every_nth_line_from_its_own(tmp_path):
    lines = [f"val/{WNID[(0, 281, 636, 967)[i % 4]]}/{i}.JPEG" for i in range(30)]
    flist = tmp_path / "l.flist"
    flist.write_text("\n".join(lines) + "\n")
    for world in range(1, 9):
        for rank in range(world):
            assert [p for p, _ in source(flist, rank=rank, world_size=world)] == lines[rank::world], (rank, world)
    assert [p for p, _ in source(flist, max_samples=10, rank=1, world_size=3)] == lines[:10][1::3]
    assert [label for _, label in source(flist, rank=2, world_size=4)] == [636] * 7


def test_shard_sizes_by_hand(monkeypatch):
    assert [_Shard(r, 2).size_of(19) for r in range(2)] == [10, 9]
    assert [_Shard(r, 7).size_of(30) for r in range(7)] == [5, 5, 4, 4, 4, 4, 4]
    assert [_Shard(0, 7).size_of(30, rank=r) for r in range(7)] == [5, 5, 4, 4, 4, 4, 4]
    assert [_Shard(r, 4).size_of(3) for r in range(4)] == [1, 1, 1, 0]
    assert _Shard().size_of(17) == 17
    assert (_Shard().rank, _Shard().world_size, _Shard().local_rank) == (0, 1, 0)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert _Shard.from_env() == _Shard(0, 1, 0)
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert _Shard.from_env() == _Shard(5, 8, 1)


# --- Top-1 and top-5, the timing window, the results, in the library -------------------------


class RankedLogits(torch.nn.Module):
    """A real module that ranks the classes in a fixed order, whatever the image; its bias is a
    parameter so that the bundle has a device. Each call may first sleep, to make a model slow."""

    def __init__(self, ranking: list[int] = RANKING, last: int = LAST, sleeps: list[float] | None = None) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(_ranking_bias(ranking, last), requires_grad=False)
        self.sleeps = list(sleeps or [])
        self.shapes: list[tuple[int, ...]] = []  # of each batch given

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.shapes.append(tuple(x.shape))
        if self.sleeps:
            time.sleep(self.sleeps.pop(0))
        return x.mean(dim=(1, 2, 3))[:, None] * 0 + self.bias


def _bundle(model: torch.nn.Module | None = None, batch_size: int | None = None) -> ModelBundle:
    transform = EvalTransform(size=8)
    pre = Preprocessing(transform.mean, transform.std)
    model = model or RankedLogits()
    return ModelBundle(pre, model, Classification(), torch.float32, transform, batch_size=batch_size)


def _batch(labels: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros((len(labels), 3, 8, 8), dtype=torch.uint8), torch.tensor(labels, dtype=torch.int64).view(-1, 1)


def test_top1_and_top5_with_labels_at_ranks_1_5_and_6():
    logits = _ranking_bias().repeat(7, 1)
    labels = torch.tensor([[AT_RANK_1], [AT_RANK_5], [AT_RANK_6], [LAST], [AT_RANK_1], [RANKING[3]], [AT_RANK_2]])
    assert [int(v) for v in Classification()(logits, labels)] == [2, 5]  # ranks 1, 5, 1, 4, 2 in the top 5
    # Fewer than 5 classes: top-5 is every class.
    assert [int(v) for v in Classification()(torch.tensor([[0.0, 2.0, 1.0]]), torch.tensor([[0]]))] == [0, 1]
    images, labels = _batch([AT_RANK_1, AT_RANK_6, AT_RANK_5])
    assert [int(v) for v in _bundle()(images, labels)] == [1, 2]
    # A bundle that pads short batches (as when compiled): the 5 padded rows never count, even
    # with a model that ranks class 0, the label nearest to the padding's, first.
    zero_first = RankedLogits(ranking=[0, 1, 2, 3, 4], last=999)
    images, labels = _batch([0, 281, 0])
    assert [int(v) for v in _bundle(zero_first, batch_size=8)(images, labels)] == [2, 2]


class NotFiniteFor(RankedLogits):
    """RankedLogits, with a NaN or an infinity in the logits of the rows given."""

    def __init__(self, rows: dict[int, float]) -> None:
        super().__init__()
        self.rows = rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x).clone()
        for row, value in self.rows.items():
            logits[row, 7] = value
        return logits


def test_an_image_whose_logits_are_not_finite_is_no_hit_and_is_counted():
    # topk still ranks a row of NaN: whatever classes it puts first would be hits.
    logits = torch.full((2, 10), math.nan)
    logits[1] = torch.arange(10.0)
    labels = torch.tensor([[int(logits[0].topk(1).indices)], [9]])
    assert [int(v) for v in Classification()(logits, labels)] == [1, 1]
    logits[1, 3] = math.inf
    assert [int(v) for v in Classification()(logits, labels)] == [0, 0]
    # In a run: rows 0 (NaN) and 2 (inf) of 4, labels at rank 1 everywhere.
    model = NotFiniteFor({0: math.nan, 2: math.inf})
    result = benchmark(iter([_batch([AT_RANK_1] * 4)]), _bundle(model), listed=4, warmup_batches=0, predictions=True)
    assert (result.classified, result.top1_correct, result.top5_correct, result.not_finite) == (4, 2, 2, 2)
    rows = result.predictions
    assert [(r["correct1"], r["correct5"], r["probs"] is None, r["top5"] is None) for r in rows] == [
        (False, False, True, True), (True, True, False, False), (False, False, True, True),
        (True, True, False, False)]  # fmt: skip
    json.dumps(rows, allow_nan=False)  # valid JSON: no bare NaN
    finite = benchmark(iter([_batch([AT_RANK_1] * 4)]), _bundle(), listed=4, warmup_batches=0)
    for run, warned in ((result, True), (finite, False)):
        out = io.StringIO()
        _print_summary(run, out)
        assert ("WARNING: 2 of the 4 images classified got NaN or infinite logits" in out.getvalue()) == warned


def test_labels_as_a_dataloader_gives_them_count_as_the_loaders_and_other_shapes_are_refused():
    # N labels (a DataLoader's) are N x 1; a row of N against the N x 5 top would broadcast: N hits each.
    images, labels = _batch([AT_RANK_1, AT_RANK_5, AT_RANK_6, LAST, AT_RANK_1])
    column = benchmark([(images, labels)], _bundle(), listed=5, warmup_batches=0, predictions=True)
    flat = benchmark([(images, labels.view(-1))], _bundle(), listed=5, warmup_batches=0, predictions=True)
    assert (flat.top1_correct, flat.top5_correct) == (column.top1_correct, column.top5_correct) == (2, 3)
    assert flat.predictions == column.predictions
    for shape in ((1, 5), (5, 2), (4, 1)):
        expected = rf"labels of shape \({shape[0]}, {shape[1]}\) for 5 images: expected 5 x 1"
        with pytest.raises(ValueError, match=expected):
            benchmark([(images, torch.zeros(shape, dtype=torch.int64))], _bundle(), listed=5, warmup_batches=0)
    # Images already scaled to 0-1 would be divided by 255 again: refused.
    with pytest.raises(ValueError, match="images of type torch.float32: expected torch.uint8"):
        benchmark([(images.float() / 255, labels)], _bundle(), listed=5, warmup_batches=0)
    # A label outside the classes (a notebook's own loader) never matches, and its row has no name.
    outside = benchmark([(images, labels + 1000)], _bundle(), listed=5, warmup_batches=0, predictions=True)
    assert (outside.top5_correct, outside.predictions[0]["label_name"]) == (0, None)


def test_predictions_hold_each_images_top5_classes_and_their_probabilities():
    # Three images in one batch: each row has the model's five best classes, their softmax over
    # the 1000 classes (not over the batch), its own label and whether it is a hit.
    expected = _ranking_bias().softmax(dim=-1)[RANKING[:5]].tolist()
    result = benchmark(iter([_batch([AT_RANK_1, AT_RANK_6, AT_RANK_5])]), _bundle(), listed=3, predictions=True)
    rows = result.predictions
    assert [r["top5"] for r in rows] == [RANKING[:5]] * 3
    assert all(r["probs"] == pytest.approx(expected, abs=1e-6) for r in rows)
    assert [(r["label"], r["correct1"], r["correct5"]) for r in rows] == [
        (AT_RANK_1, True, True), (AT_RANK_6, False, False), (AT_RANK_5, False, True)]  # fmt: skip


def test_short_batches_are_padded_to_the_compiled_batch_size():
    # A compiled model is given full batches only, so the last, short one compiles nothing new.
    padded, pairs, unpadded = RankedLogits(), RankedLogits(), RankedLogits()
    for n in (1, 3, 4):
        _bundle(padded, batch_size=4)(*_batch([AT_RANK_1] * n))
        _bundle(unpadded)(*_batch([AT_RANK_1] * n))
    _bundle(pairs, batch_size=2)(*_batch([AT_RANK_1]))
    rows = [[shape[0] for shape in model.shapes] for model in (padded, pairs, unpadded)]
    assert rows == [[4, 4, 4], [2], [1, 3, 4]]


def _slow_loader(*batches: tuple[float, list[int]]):
    """Batches of real tensors, each ``(seconds, labels)``: the batch arrives after that long."""
    for seconds, labels in batches:
        time.sleep(seconds)
        yield _batch(labels)


def test_fps_window_leaves_out_a_slow_warmup():
    # 2 warm-up batches of 5 images (2 s), then 4 timed batches of 3 (0.2 s of waiting for them).
    warmup = [(1.0, [AT_RANK_1] * 5), (1.0, [AT_RANK_6] * 5)]
    timed = [(0.05, [AT_RANK_1, AT_RANK_5, AT_RANK_6])] * 3 + [(0.05, [LAST, AT_RANK_5, AT_RANK_5])]
    result = benchmark(_slow_loader(*warmup, *timed), _bundle(), listed=22, warmup_batches=2)
    assert (result.classified, result.failed, result.not_reached, result.batches) == (22, 0, 0, 6)
    assert (result.decoder_fallbacks, result.failures) == (0, [])
    assert (result.top1_correct, result.top5_correct) == (5 + 3, 5 + 3 + 3 + 2)
    assert (result.frames_timed, result.warmup_included, result.partial) == (12, False, False)
    # The window holds the 4 timed batches' 0.2 s of waiting; any part of the warm-up adds 1 s or
    # more. The 0.8 s of slack is for a loaded machine running a model that does no work.
    assert 0.2 <= result.elapsed_s < 1.0, result.elapsed_s
    assert result.fps == 12 / result.elapsed_s


def test_a_batch_whose_images_all_failed_is_no_warmup_batch():
    # An empty batch runs no model: counted as the warm-up, the window held the model's first call (its
    # compilation) and the FPS was some 100 times too low. Under a barrier (torchrun) every batch counts,
    # so that each rank's barrier comes at the same batch.
    batches = [(0.0, []), (0.0, []), (1.0, [AT_RANK_1] * 5)] + [(0.05, [AT_RANK_1, AT_RANK_5, AT_RANK_6])] * 4
    result = benchmark(_slow_loader(*batches), _bundle(), listed=17, warmup_batches=1)
    assert (result.frames_timed, result.batches_timed, result.warmup_included) == (12, 4, False)
    assert result.elapsed_s < 1.0 and result.timeline["warmup_end_s"] >= 1.0, result.timeline
    locked = benchmark(_slow_loader(*batches), _bundle(), listed=17, warmup_batches=1, sync_clocks=lambda: None)
    assert (locked.frames_timed, locked.batches_timed) == (17, 6) and locked.elapsed_s >= 1.0
    # No warm-up: every batch, empty ones too, is in the window from the start.
    cold = benchmark(_slow_loader(*batches), _bundle(), listed=17, warmup_batches=0)
    assert (cold.frames_timed, cold.batches_timed, cold.warmup_included) == (17, 7, False)
    assert cold.timeline["warmup_end_s"] == 0.0 and cold.elapsed_s >= 1.0
    with pytest.raises(ValueError, match="warmup_batches=-1"):
        benchmark(_slow_loader(*batches), _bundle(), listed=17, warmup_batches=-1)


def test_bad_images_first_in_the_list_leave_the_warmup_to_the_first_that_reach_the_model(
    ranked_set, ranked_checkpoint, tmp_path, capfd
):
    lines = ranked_set.read_text().splitlines()  # good, bad x 3, good x 16
    flist = tmp_path / "bad_first.flist"
    flist.write_text("\n".join([*lines[1:4], lines[0], *lines[4:]]) + "\n")
    out = tmp_path / "r.json"
    proc = run_main(capfd, "--input-flist", flist, "--prefix", f"{ranked_set.parent}/", *RUN, "--checkpoint",
                    ranked_checkpoint, "--batch-size", "1", "--warmup-batches", "2", "--skip-bad", "--results-file",
                    out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = read_json(out)
    assert (result["classified"], result["failed"]) == (17, BAD)
    assert (result["frames_timed"], result["batches_timed"], result["batches"]) == (15, 15, 20)
    assert result["timeline"]["batch_images"][:5] == [0, 0, 0, 1, 1]


def test_fps_of_a_window_the_loader_had_buffered_stays_within_its_stated_bound():
    # A loader at 10 batches/s that had 3 batches ready when the window opened (decoded during
    # a slow warm-up): a window of 6 batches takes 0.3 s, not 0.6 s, so FPS is twice the
    # loader's rate, and the result says FPS may be up to 3 / (6 - 3) = 100 % high.
    warmup = [(1.0, [AT_RANK_1] * 2), (1.0, [AT_RANK_1] * 2)]
    buffered, produced = [(0.0, [AT_RANK_1] * 2)] * 3, [(0.1, [AT_RANK_1] * 2)] * 3
    result = benchmark(_slow_loader(*warmup, *buffered, *produced), _bundle(), listed=16, warmup_batches=2,
                       loader_lead=3)  # fmt: skip
    assert (result.batches, result.batches_timed, result.loader_lead) == (8, 6, 3)
    assert result.fps_max_overstatement == 1.0
    loader_rate = 2 / 0.1  # images/s the loader makes
    assert result.fps > 1.5 * loader_rate  # the buffered batches inflate FPS ...
    assert result.fps <= loader_rate * (1 + result.fps_max_overstatement) * 1.01  # ... within the bound
    out = io.StringIO()
    _print_summary(result, out)
    assert "the FPS window holds 6 batches and the loader may have had 3 ready" in out.getvalue()
    assert "FPS may be up to 100% high" in out.getvalue()


@pytest.mark.parametrize(
    ("timed", "lead", "included", "known_fps", "expected", "in_json"),
    [(100, 20, False, None, 0.25, 0.25), (110, 10, False, None, 0.1, 0.1), (20, 20, False, None, math.inf, None),
     (5, 20, False, None, math.inf, None), (5, 20, True, None, None, None), (100, None, False, None, None, None),
     (0, 4, False, None, None, None),
     # A loader known to reach 8 images/s caps the bound at FPS (10 here) / 8 - 1; one known to
     # reach the FPS or more clears it, even over a window it may have had all buffered.
     (100, 20, False, 8.0, 0.25, 0.25), (100, 20, False, 9.0, 10 / 9 - 1, 10 / 9 - 1), (5, 20, False, 10.0, 0.0, 0.0),
     (5, 20, False, 50.0, 0.0, 0.0)],
)  # fmt: skip
def test_fps_overstatement_bound_by_hand(timed, lead, included, known_fps, expected, in_json):
    result = RunResult(listed=1000, batches_timed=timed, loader_lead=lead, warmup_included=included,
                       loader_min_fps=known_fps, frames_timed=10 * timed, elapsed_s=timed)  # FPS 10  # fmt: skip
    assert result.fps_max_overstatement == (pytest.approx(expected) if expected else expected)
    d = result.to_dict()
    assert d["fps_max_overstatement"] == (pytest.approx(in_json) if in_json else in_json)
    assert d["fps_window_may_be_buffered"] == (expected == math.inf)  # a flag: the bound stays a number or null
    out = io.StringIO()
    _print_summary(result, out)
    warned = "the FPS window holds" in out.getvalue()
    assert warned == (expected is not None and expected > 0.1)
    assert ("FPS may be the model's rate alone" in out.getvalue()) == (expected == math.inf)
    if warned:  # never more batches ready than the window has
        had = "all of them" if lead >= timed else str(lead)
        assert f"the FPS window holds {timed} batches and the loader may have had {had} ready" in out.getvalue()


def _piped_run(decode_s: float, model_s: float, batches: int, warmup: int) -> RunResult:
    """A real SPDL pipeline whose decode takes ``decode_s`` per batch (2 at once, sink buffer 2),
    consumed by a loop that takes ``model_s`` per batch; the measured lead and rate applied."""
    from imagenet_classification import _add_window_lead, _PipelineStats, get_pipeline

    def decode(items):
        time.sleep(decode_s)
        return _batch([AT_RANK_1] * len(items))

    def slow(it):
        for batch in it:
            time.sleep(model_s)
            yield batch

    stats = _PipelineStats()
    pipeline = get_pipeline([("x", 0)] * (2 * batches), 2, decode, 2, 2, 2, stats=stats)
    with pipeline.auto_stop():
        result = benchmark(slow(pipeline.get_iterator(timeout=30)), _bundle(), listed=2 * batches,
                           warmup_batches=warmup, sync_clocks=stats.start_window, loader_lead=2 + 3 + 2)  # fmt: skip
    _add_window_lead(result, stats, 2)
    return result


def test_the_lead_and_the_loaders_rate_measured_when_the_window_opens():
    # A loader far ahead of the model (decode 1 ms, model 50 ms a batch): every batch made before
    # the window of 4 opens, so it may all be buffered, but the loader is known to reach many times
    # the FPS: no overstatement, no warning.
    fast = _piped_run(0.001, 0.05, 6, 2)
    assert fast.batches_timed == 4 and fast.loader_lead == 4  # never more than the window's batches
    assert fast.loader_min_fps > 5 * fast.fps and fast.fps_max_overstatement == 0.0
    out = io.StringIO()
    _print_summary(fast, out)
    assert "WARNING" not in out.getvalue()
    # A loader slower than the model (decode 0.2 s a batch, 2 at once: 10 batches/s at most, the
    # model 1 ms): it delivers at about its own rate, FPS is about that, and the bound is small.
    slow = _piped_run(0.2, 0.001, 12, 2)
    assert slow.batches_timed == 10 and slow.loader_lead <= 2 + 3 + 2
    assert slow.loader_min_fps <= 2 * 10 * 1.05  # images/s: 2 a batch, 10 batches/s at most
    assert slow.fps <= slow.loader_min_fps * (1 + slow.fps_max_overstatement) * 1.001


def _drained(batch_end_s, batches_timed, loader_end_s, images=8, partial=False, included=False):
    from imagenet_classification import _add_drain

    ends = list(batch_end_s)
    counts = images if isinstance(images, list) else [images] * len(ends)
    result = RunResult(listed=sum(counts), classified=sum(counts), batches=len(ends), batches_timed=batches_timed,
                       frames_timed=sum(counts[len(ends) - batches_timed :]), partial=partial,
                       warmup_included=included)  # fmt: skip
    warm = 0.0 if included else ends[len(ends) - batches_timed - 1]
    result.elapsed_s = ends[-1] - warm
    result.timeline = {"started_at": 100.0, "warmup_end_s": warm, "batch_end_s": ends, "batch_images": counts}
    _add_drain(result, None if loader_end_s is None else 100.0 + loader_end_s)
    out = io.StringIO()
    _print_summary(result, out)
    return result, out.getvalue()


def test_batches_the_model_ran_after_the_loaders_end_by_hand():
    from imagenet_classification import _PipelineStats

    # Batches end at 1, 2, 3, 3.5 and 4 s, the first the warm-up: the loader ended at 2.2 s, while the
    # third ran; the model began the last two after it, and ran them twice as fast.
    result, out = _drained([1, 2, 3, 3.5, 4], 4, 2.2)
    assert (result.drained_batches, result.fps_while_loading) == (2, 8.0)  # 16 images from 1 s to 3 s
    assert result.fps == pytest.approx(32 / 3) and result.timeline["loader_end_s"] == pytest.approx(2.2)
    assert "the model ran the last 2 of the 4 timed batches after the loader had decoded its last" in out
    assert "FPS is 33% above the 8.00 images/s before it" in out
    assert (result.to_dict()["drained_batches"], result.to_dict()["fps_while_loading"]) == (2, 8.0)
    # The loader done before the window opened: every timed batch ran with the cores to the model.
    result, out = _drained([1, 2, 3, 3.5, 4], 4, 0.5)
    assert (result.drained_batches, result.fps_while_loading) == (4, None)
    assert "the model ran the last 4 of the 4 timed batches" in out and "FPS is the model's rate alone" in out
    # Done just as the last batch began: that one ran alone. Done after: nothing drained, no warning.
    assert _drained([1, 2, 3, 3.5, 4], 4, 3.5)[0].drained_batches == 1
    for end in (3.6, 9.0):
        result, out = _drained([1, 2, 3, 3.5, 4], 4, end)
        assert (result.drained_batches, result.fps_while_loading) == (0, pytest.approx(result.fps)), end
        assert "WARNING" not in out
    result, out = _drained([1, 2, 3, 4, 5], 4, 2.5)
    assert (result.drained_batches, result.fps_while_loading) == (2, 8.0) and "WARNING" not in out
    # More than half the window after the loader's end: too few batches for a rate before it.
    result, out = _drained([1, 2, 3, 3.5, 4], 4, 1.5)
    assert (result.drained_batches, result.fps_while_loading) == (3, None) and "FPS is mostly the model's" in out
    # No image before it (every image of those batches skipped as bad): no rate, and no division by 0.
    result, out = _drained([1, 2, 3, 3.5, 4], 4, 3.2, images=[8, 0, 0, 0, 8])
    assert (result.drained_batches, result.fps_while_loading) == (1, None) and "FPS is mostly the model's" in out
    # A window that includes the warm-up: from the start. No loader's end known: nothing said.
    result, out = _drained([1, 2, 3, 3.5, 4], 5, 2.2, included=True)
    assert (result.drained_batches, result.fps_while_loading) == (2, 8.0)  # 24 images in the first 3 s
    assert "the model ran the last 2 of the 5 timed batches" in out
    result, out = _drained([1, 2, 3, 3.5, 4], 4, None)
    assert (result.drained_batches, result.fps_while_loading) == (None, None) and "WARNING" not in out
    assert "loader_end_s" not in result.timeline and _PipelineStats().loader_end() is None
    # A stopped run's loader did not end: nothing said of it.
    result, out = _drained([1, 2, 3, 3.5, 4], 4, 2.2, partial=True)
    assert (result.drained_batches, result.fps_while_loading) == (None, None) and "after the loader" not in out
    result, out = _drained([1, 2, 3, 3.95, 4.9], 4, 2.5)  # FPS 2.6 % above: within DRAIN_SLACK
    assert result.drained_batches == 2 and result.fps < 8.0 * 1.03 and "WARNING" not in out
    assert "FPS is 5% above the 8.00 images/s" in _drained([1, 2, 3, 3.9, 4.8], 4, 2.5)[1]


def test_the_batches_after_a_real_pipelines_end_are_found():
    # Decode 20 ms a batch, 2 at once, far ahead of a model of 50 ms: the loader ends when the
    # model has taken all but what it holds ahead (sink buffer 2, 2 under way, 3 between).
    from imagenet_classification import _add_drain, _PipelineStats, get_pipeline

    def decode(items):
        time.sleep(0.02)
        return _batch([AT_RANK_1] * len(items))

    def slow(it):
        for batch in it:
            time.sleep(0.05)
            yield batch

    stats = _PipelineStats()
    with (pipeline := get_pipeline([("x", 0)] * 48, 2, decode, 2, 2, 2, stats=stats)).auto_stop():
        result = benchmark(slow(pipeline.get_iterator(timeout=30)), _bundle(), listed=48, warmup_batches=2,
                           sync_clocks=stats.start_window)  # fmt: skip
    _add_drain(result, stats.loader_end())
    t = result.timeline
    assert t["warmup_end_s"] < t["loader_end_s"] < t["batch_end_s"][-1]
    assert 2 + 2 <= result.drained_batches <= 2 + 3 + 2 + 1
    kept = result.batches_timed - result.drained_batches
    span = t["batch_end_s"][2 + kept - 1] - t["warmup_end_s"]
    assert result.fps_while_loading == pytest.approx(2 * kept / span)
    assert result.fps_while_loading == pytest.approx(result.fps, rel=0.2)  # the model's sleep shares nothing


def test_a_run_states_its_loaders_lead_and_the_bound(tmp_path, capfd):
    # SPDL's lead is the sink buffer plus the batches decoded at once: 3 + 2 here.
    flist = tmp_path / "val.flist"
    lines = []
    for i in range(12):
        write_jpeg(tmp_path / f"val/n01440764/{i}.JPEG", (80, 60), (120, 90, 60), seed=i)
        lines.append(f"val/n01440764/{i}.JPEG")
    flist.write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.json"
    proc = run_main(capfd, "--input-flist", flist, "--prefix", f"{tmp_path}/", "--model", "test_efficientnet",
                    "--device", "cpu", "--no-pretrained", "--no-compile", "--no-bf16", "--batch-size", "1",
                    "--num-threads", "2", "--queue-size", "3", "--warmup-batches", "2",
                    "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = read_json(out)
    # Measured when the window opened: at most the capacity (3 + 3 + 2) and the window's 10 batches.
    assert r["batches_timed"] == 10 and 0 <= r["loader_lead"] <= 8
    structural = math.inf if r["loader_lead"] >= 10 else r["loader_lead"] / (10 - r["loader_lead"])
    known = max(0.0, r["fps"] / r["loader_min_fps"] - 1) if r["loader_min_fps"] else math.inf
    assert r["loader_min_fps"] is None or r["loader_min_fps"] > 0
    bound = min(structural, known)
    assert r["fps_max_overstatement"] == (None if bound == math.inf else pytest.approx(bound))
    assert r["fps_window_may_be_buffered"] == (bound == math.inf)
    # On the CPU: the timed batches the model began after the loader's last, and FPS before them.
    t, drained = r["timeline"], r["drained_batches"]
    assert 0 <= drained <= 8 and t["loader_end_s"] > 0
    began = [t["warmup_end_s"], *t["batch_end_s"][2:-1]]  # of each timed batch: the one before it ends
    assert all(b < t["loader_end_s"] for b in began[: 10 - drained])
    assert all(b >= t["loader_end_s"] for b in began[10 - drained :])
    kept = t["batch_end_s"][2 : 12 - drained]
    if len(kept) >= drained:
        assert r["fps_while_loading"] == pytest.approx(len(kept) / (kept[-1] - t["warmup_end_s"]), rel=1e-4)
    assert ("the FPS window holds 10 batches" in proc.stdout) == (bound > 0.1)


def test_timeline_by_hand():
    # Batches of 2, 3, 4 and 5 images end about 0.2, 0.5, 1.5 and 2.5 s into the run (each at
    # least 0.3 s from a second's edge, for a loaded machine): per second 5, 4 and 5 images.
    loader = _slow_loader((0.2, [AT_RANK_1] * 2), (0.3, [AT_RANK_1] * 3), (1.0, [AT_RANK_1] * 4),
                          (1.0, [AT_RANK_1] * 5))  # fmt: skip
    result = benchmark(loader, _bundle(), listed=14, warmup_batches=1)
    t = result.timeline
    assert (t["interval_s"], t["images"], t["images_per_s"], t["batch_images"]) == (1.0, [5, 4, 5], [5.0, 4.0, 5.0],
                                                                                   [2, 3, 4, 5])  # fmt: skip
    assert t["batch_end_s"] == pytest.approx([0.2, 0.5, 1.5, 2.5], abs=0.25)
    assert t["warmup_end_s"] == pytest.approx(0.2, abs=0.25) and t["end_s"] == pytest.approx(2.5, abs=0.25)
    assert t["end_s"] - t["warmup_end_s"] == pytest.approx(result.elapsed_s, abs=0.01)
    # A run no longer than its warm-up: the window starts at 0. A run of no batch: one empty second.
    short = benchmark(_slow_loader((0.2, [AT_RANK_1] * 2)), _bundle(), listed=2, warmup_batches=1).timeline
    assert (short["warmup_end_s"], short["images"]) == (0.0, [2])
    assert benchmark(iter([]), _bundle(), listed=0).timeline["images"] == [0]
    # Another interval: half-seconds, 4 images in the second of them, 6 in the fourth.
    window = _TimingWindow(torch.device("cpu"), warmup_batches=0)
    for seconds, frames in ((0.7, 4), (1.0, 6)):
        time.sleep(seconds)
        window.add(frames)
    window.close()
    half = window.timeline(0.5)
    assert (half["interval_s"], half["images"], half["images_per_s"]) == (0.5, [0, 4, 0, 6], [0.0, 8.0, 0.0, 12.0])


def test_timeline_covers_the_idle_tail_after_the_last_batch():
    # The warm-up's batch ends about 1.2 s in, the last 1.3 s in, and the loader ends 1.2 s after
    # it: the timeline spans the whole run (about 2.5 s, 3 seconds), the last second empty.
    def loader():
        yield from _slow_loader((1.2, [AT_RANK_1] * 2), (0.1, [AT_RANK_1] * 3))
        time.sleep(1.2)

    t = benchmark(loader(), _bundle(), listed=5, warmup_batches=1).timeline
    assert t["end_s"] == pytest.approx(2.5, abs=0.4)
    assert (t["images"], t["batch_images"]) == ([0, 5, 0], [2, 3])


def test_fps_window_ends_with_the_last_batch_not_the_loaders_end_or_a_stop():
    # SPDL sees its end of stream up to 0.1 s after the last batch, and a stalled loader raises only
    # at its time-out: neither is time the loader delivered in. The window ends with the last batch.
    def ends_late(then: Exception | None = None):
        yield from _slow_loader((0.1, [AT_RANK_1] * 2), (0.3, [AT_RANK_1] * 3))
        time.sleep(1.0)
        if then is not None:
            raise then

    result = benchmark(ends_late(), _bundle(), listed=5, warmup_batches=1)
    t = result.timeline
    assert result.frames_timed == 3 and result.elapsed_s == pytest.approx(0.3, abs=0.15)
    assert t["window_end_s"] == pytest.approx(t["batch_end_s"][-1], abs=1e-5) and t["end_s"] > t["window_end_s"] + 0.8
    assert result.elapsed_s == pytest.approx(t["window_end_s"] - t["warmup_end_s"])
    with pytest.raises(RunStopped) as stop:  # the loader's time-out: a stall, its partial result kept
        benchmark(ends_late(TimeoutError()), _bundle(), listed=9, warmup_batches=1)
    assert stop.value.kind == "stalled" and stop.value.result.frames_timed == 3
    assert stop.value.result.elapsed_s == pytest.approx(0.3, abs=0.15)

    # A stall before any batch: no time timed, not the whole time-out with no image in it.
    def stalls_at_once():
        time.sleep(0.3)
        raise TimeoutError
        yield

    with pytest.raises(RunStopped) as stop:
        benchmark(stalls_at_once(), _bundle(), listed=2)
    assert (stop.value.result.frames_timed, stop.value.result.elapsed_s) == (0, 0.0)
    # No batch after the warm-up: the window is the whole run, up to its last batch all the same.
    short = benchmark(ends_late(), _bundle(), listed=5, warmup_batches=2)
    assert short.warmup_included and short.elapsed_s == pytest.approx(0.4, abs=0.15)


@pytest.mark.parametrize("warmup_batches", [2, 3])
def test_fps_window_of_a_run_no_longer_than_the_warmup_covers_it_all(warmup_batches):
    # 2 batches, each after 0.3 s: a warm-up of 2 (just as long) or of 3 (longer) covers them all.
    loader = _slow_loader((0.3, [AT_RANK_1] * 4), (0.3, [AT_RANK_1] * 2))
    result = benchmark(loader, _bundle(), listed=6, warmup_batches=warmup_batches)
    assert (result.frames_timed, result.batches, result.warmup_included, result.top1_correct) == (6, 2, True, 6)
    assert 0.6 <= result.elapsed_s < 1.5 and result.fps == 6 / result.elapsed_s
    assert (result.batches_timed, result.fps_max_overstatement) == (2, None)  # the whole run is timed


def test_benchmark_defaults_to_the_clis_warmup_and_to_stopping_at_a_bad_image():
    # A notebook's benchmark() times as the command line does by default: 20 warm-up batches.
    result = benchmark((_batch([AT_RANK_1]) for _ in range(21)), _bundle(), listed=21)
    assert (result.frames_timed, result.batches, result.warmup_included) == (1, 21, False)
    assert (result.predictions, result.loader_lead) == (None, None)  # no rows kept unless asked
    result = benchmark((_batch([AT_RANK_1]) for _ in range(20)), _bundle(), listed=20)
    assert (result.frames_timed, result.warmup_included) == (20, True)
    # And stops at a bad image unless told to skip, naming the first of them.
    failures = [ImageDecodeError("bad.JPEG", "empty file (0 bytes)"),
                ImageDecodeError("worse.JPEG", "is a directory, not an image file")]  # fmt: skip
    with pytest.raises(Exception, match="cannot decode bad.JPEG: empty file") as info:
        benchmark(iter([_Batch(*_batch([AT_RANK_1]), failures=failures)]), _bundle(), listed=3,
                  policy=BadImagePolicy())  # fmt: skip
    assert (info.value.result.classified, info.value.result.failed, info.value.result.not_reached) == (0, 2, 1)


def test_loader_alone_and_model_alone_are_timed_after_their_warmup():
    # The loader: 2 warm-up batches of 100 images after 0.5 s each, then 4 batches of 1 image
    # after 0.25 s each: 4 images in 1.0-1.5 s (0.5 s of slack for a loaded machine), 2.67-4
    # images/s. Counting a warm-up batch's images would make it 70 or more; its time, 2.67 or less.
    loader = _slow_loader(*[(0.5, [0] * 100)] * 2, *[(0.25, [0])] * 4)
    assert 4 / 1.5 < measure_loader(loader, torch.device("cpu"), warmup_batches=2) <= 4 / 1.0
    # The model: 2 warm-up calls of 1 s, then 4 of 0.25 s, on batches of 1 image: 2.67-4 images/s
    # again. Counting a warm-up batch's image would make it more than 4, its time less than 2.67
    # (both: 6 images in 3 s or more, 2 images/s).
    model = RankedLogits(sleeps=[1.0, 1.0] + [0.25] * 4)
    assert 4 / 1.5 < _measure_model(_bundle(model), batch_size=1, num_batches=6, warmup_batches=2) <= 4 / 1.0
    assert model.shapes == [(1, 3, 8, 8)] * 6  # 6 batches of the model's input size


def test_results_and_their_rates_by_hand(tmp_path):
    result = RunResult(listed=10, classified=7, failed=2, top1_correct=3, top5_correct=5, frames_timed=6,
                       elapsed_s=1.5, batches=4, decoder_fallbacks=1)  # fmt: skip
    d = result.to_dict()
    assert (d["not_reached"], d["fps"], d["top1"], d["top5"]) == (1, 4.0, 3 / 7, 5 / 7)
    assert (d["listed"], d["classified"], d["failed"], d["frames_timed"], d["elapsed_s"]) == (10, 7, 2, 6, 1.5)
    assert (d["top1_correct"], d["top5_correct"], d["batches"], d["decoder_fallbacks"]) == (3, 5, 4, 1)
    empty = RunResult(listed=4, failed=4).to_dict()
    assert (empty["not_reached"], empty["fps"], empty["top1"], empty["top5"]) == (0, 0.0, None, None)  # 0/0
    assert RunResult(listed=3).to_dict() == {
        "listed": 3, "classified": 0, "failed": 0, "top1_correct": 0, "top5_correct": 0, "frames_timed": 0,
        "elapsed_s": 0.0, "batches": 0, "decoder_fallbacks": 0, "decoder_backends": {}, "not_finite": 0,
        "warmup_included": False,
        "batches_timed": 0, "loader_lead": None, "loader_min_fps": None, "drained_batches": None,
        "fps_while_loading": None, "partial": False, "stop_reason": None,
        "failures": [], "timeline": None, "page_cache": None, "not_reached": 3, "fps": 0.0,
        "fps_max_overstatement": None, "fps_window_may_be_buffered": False, "top1": None, "top5": None,
    }  # fmt: skip
    assert RunResult(listed=None, classified=3).not_reached == 0
    assert RunResult(listed=3, classified=4).not_reached == 0  # never negative
    result.record_failures([ImageDecodeError("a.JPEG", "empty file (0 bytes)"), ImageDecodeError("b.JPEG", "x")])
    assert (result.failed, result.failures) == (2, [{"path": "a.JPEG", "reason": "empty file (0 bytes)"},
                                                     {"path": "b.JPEG", "reason": "x"}])  # fmt: skip


def test_a_window_whose_every_image_failed_measures_nothing_and_says_so():
    from imagenet_classification import _add_drain

    # The warm-up classifies 2 images; every image after it fails: FPS 0 over a window of one empty
    # batch is no rate, and no warning may read it as one (a buffered window, the loader's drain).
    def loader():
        yield _Batch(*_batch([AT_RANK_1, AT_RANK_5]))
        yield _Batch(*_batch([]), failures=[ImageDecodeError("bad.JPEG", "empty file (0 bytes)")])

    result = benchmark(loader(), _bundle(), listed=3, warmup_batches=1, policy=BadImagePolicy(skip=True), loader_lead=4)
    assert (result.classified, result.failed, result.batches_timed, result.frames_timed) == (2, 1, 1, 0)
    assert (result.fps, result.fps_max_overstatement, result.to_dict()["fps_window_may_be_buffered"]) == (
        0,
        None,
        False,
    )
    _add_drain(result, result.timeline["started_at"])  # the loader ended before the window: still no rate to correct
    assert (result.drained_batches, result.fps_while_loading) == (None, None)
    out = io.StringIO()
    _print_summary(result, out)
    assert "WARNING: every image of the FPS window failed to decode: FPS measures nothing" in out.getvalue()
    assert "FPS window holds" not in out.getvalue() and "after the loader" not in out.getvalue()
    assert "no image was classified" not in out.getvalue()


def test_failures_fallbacks_and_not_reached_reach_the_summary_and_the_results_file(tmp_path):
    # The decode function lists each batch's failures and GPU-decoder fallbacks with the batch; on
    # this CPU-only machine a generator stands in for it.
    policy = BadImagePolicy(skip=True)

    def loader():
        yield _Batch(*_batch([AT_RANK_1, AT_RANK_5]), fallbacks=1, decoded_by={"hardware": 1})
        yield _Batch(*_batch([AT_RANK_6]), failures=[ImageDecodeError("bad1.JPEG", "empty file (0 bytes)")],
                     fallbacks=2, decoded_by={"hardware": 1, "cuda": 1})  # fmt: skip
        cut = ImageDecodeError("bad2.JPEG", "truncated JPEG (no end-of-image marker)")
        yield _Batch(*_batch([]), failures=[cut])  # every image of this batch failed

    # 8 listed, 3 classified, 2 failed: the loader ended 3 images short.
    model = RankedLogits()
    with pytest.raises(Exception, match="before delivering every listed image") as info:
        benchmark(loader(), _bundle(model), listed=8, warmup_batches=0, policy=policy)
    assert [shape[0] for shape in model.shapes] == [2, 1]  # the empty batch never reaches the model
    result = info.value.result
    assert (result.listed, result.classified, result.failed, result.not_reached) == (8, 3, 2, 3)
    assert (result.decoder_fallbacks, result.partial, result.top1_correct, result.top5_correct) == (3, True, 1, 2)
    assert [f["path"] for f in result.failures] == ["bad1.JPEG", "bad2.JPEG"]
    assert result.decoder_backends == {"hardware": 2, "cuda": 1}  # each batch's, added up
    summary = io.StringIO()
    _print_summary(result, summary)
    lines = summary.getvalue().splitlines()
    assert "Images: listed=8 classified=3 failed=2 not_reached=3 (PARTIAL RUN)" in lines
    assert (
        "  3 images (100.0%) decoded on the CPU: the GPU decoder cannot take them; the figures are mostly the CPU's"
        in lines
    )
    assert "Accuracy (top5)=66.67% (2/3, 2 failed to decode)" in lines
    assert "  failed: bad2.JPEG: truncated JPEG (no end-of-image marker)" in lines
    out = tmp_path / "r.json"
    _write_results(out, _RunReport(result, {}, {}, [{"rank": 0}]))
    written = read_json(out)
    assert (written["decoder_fallbacks"], written["failed"], written["not_reached"]) == (3, 2, 3)
    assert (written["top1"], written["top5"], written["world_size"]) == (1 / 3, 2 / 3, 1)


@pytest.mark.parametrize("failed, more", [(10, None), (11, "  ... and 1 more (a JSON --results-file lists them all)")])
def test_summary_lists_ten_failures_then_counts_the_rest(failed, more):
    result = RunResult(listed=failed)
    result.record_failures([ImageDecodeError(f"{i}.JPEG", "empty file (0 bytes)") for i in range(failed)])
    summary = io.StringIO()
    _print_summary(result, summary)
    lines = summary.getvalue().splitlines()
    listed = [line for line in lines if line.startswith("  failed: ")]
    assert listed == [f"  failed: {i}.JPEG: empty file (0 bytes)" for i in range(10)]
    assert [line for line in lines if line.startswith("  ... and")] == ([more] if more else [])
    assert f"Accuracy (top1)=n/a (0/0, {failed} failed to decode)" in lines


MOSTLY_CPU = "; the figures are mostly the CPU's"


@pytest.mark.parametrize(
    ("classified", "fallbacks", "line"),
    [(80, 4, "  4 images (5.0%) decoded on the CPU: the GPU decoder cannot take them"),
     (80, 5, "  5 images (6.2%) decoded on the CPU: the GPU decoder cannot take them" + MOSTLY_CPU),
     (0, 2, "  2 images (100.0%) decoded on the CPU: the GPU decoder cannot take them" + MOSTLY_CPU)],
)  # fmt: skip
def test_fallback_share_in_the_summary_by_hand(classified, fallbacks, line):
    # The share is of the classified images; over 5 % (not at it) the summary says so.
    out = io.StringIO()
    _print_summary(RunResult(listed=100, classified=classified, failed=7, decoder_fallbacks=fallbacks), out)
    assert line in out.getvalue().splitlines()


def test_summary_of_a_run_without_failures_says_none():
    summary = io.StringIO()
    _print_summary(RunResult(listed=5, classified=5, top1_correct=2, top5_correct=4, frames_timed=4, elapsed_s=2.0,
                            batches=3), summary)  # fmt: skip
    assert summary.getvalue().splitlines() == [
        "FPS=2.00 (4/2.00)",
        "Accuracy (top1)=40.00% (2/5)",
        "Accuracy (top5)=80.00% (4/5)",
        "Images: listed=5 classified=5 failed=0 not_reached=0",
    ]


@pytest.mark.parametrize(
    ("batches", "ends", "included", "warned"),
    [(4, [3.25, 4.25, 5.25, 6.25], False, True),  # the first batch over 3 times the others' mean (1 s)
     (2, [3.25, 4.25], False, True),  # one other batch is a mean
     (4, [3.0, 4.0, 5.0, 6.0], False, False),  # at 3 times: no warning
     (5, [3.25, 4.25, 5.25, 6.25, 7.25], False, False),  # a warm-up batch was left out of the window
     (4, [3.25, 4.25, 5.25, 6.25], True, False),  # no more batches than the warm-up: a warning of its own
     (1, [3.25], False, False)],  # one batch: no others to compare it with
)  # fmt: skip
def test_a_window_opened_at_the_start_is_warned_of_by_hand(batches, ends, included, warned):
    # The window timed 4 batches (fewer if fewer ran); it opened at the start only if no batch was left out.
    timed = min(batches, 4)
    result = RunResult(listed=4 * batches, classified=4 * batches, frames_timed=4 * timed, elapsed_s=ends[-1],
                       batches=batches, batches_timed=timed, warmup_included=included,
                       timeline={"batch_end_s": ends})  # fmt: skip
    out = io.StringIO()
    _print_summary(result, out)
    said = f"WARNING: the FPS window opens at the start (no warm-up): its first batch took {ends[0]:.2f} s of its "
    said += f"{ends[-1]:.2f} (start-up, compilation): give --warmup-batches 1 or more"
    assert (said in out.getvalue().splitlines()) is warned, out.getvalue()
    assert ("opens at the start" in out.getvalue()) is warned
    assert ("FPS includes it" in out.getvalue()) is included


def test_the_summarys_warnings_by_hand():
    # Each warning of the summary, at the figures that call for it and at the ones that do not.
    def summary(**figures) -> str:
        out = io.StringIO()
        _print_summary(RunResult(listed=8, **figures), out)
        return out.getvalue()

    none = "WARNING: no image was classified, 8 failed to decode: FPS and accuracy measure nothing"
    assert none in summary(failed=8, batches=2, batches_timed=1)
    assert "no image was classified" not in summary(classified=6, failed=2, frames_timed=2, elapsed_s=1.0, batches=2,
                                                    batches_timed=1)  # fmt: skip
    assert "no image was classified" not in summary(classified=8, frames_timed=4, elapsed_s=1.0, batches=2,
                                                    batches_timed=1)  # fmt: skip
    window = "WARNING: every image of the FPS window failed to decode: FPS measures nothing"
    assert window in summary(classified=4, failed=4, batches=2, batches_timed=1)
    assert window not in summary(classified=8, frames_timed=4, elapsed_s=1.0, batches=2, batches_timed=1)
    assert window not in summary(classified=4, failed=4)  # no batch timed: nothing to say of its window
    not_finite = ("WARNING: 3 of the 8 images classified got NaN or infinite logits: no prediction, counted as "
                  "misses. A diverged checkpoint, --mean/--std, or an overflow in --dtype float16 or bfloat16 "
                  "(try --dtype float32)?")  # fmt: skip
    assert not_finite in summary(classified=8, not_finite=3).splitlines()
    assert "NaN" not in summary(classified=8)
    backends = {"nvjpeg": 3, "hw_nvjpeg": 2, "cuda": 0, "ffmpeg": 2, "pil": 1}
    said = summary(classified=8, decoder_backends=backends).splitlines()
    assert "  decoded on the GPU, per backend: hw_nvjpeg 2, nvjpeg 3" in said
    assert "  1 image (12.5%) decoded by PIL, not FFmpeg: not JPEG or PNG, an animated PNG, a CMYK or " \
        "arithmetic-coded JPEG, or a small one" in said  # fmt: skip
    assert "decoded on the GPU" not in summary(classified=8, decoder_backends={"ffmpeg": 8, "nvjpeg": 0})


def test_images_decoded_by_pil_are_said_unless_the_loader_is_pils():
    # SPDL's loader hands PIL only the images FFmpeg cannot take: the summary says how many. The
    # DataLoader baseline (--loader torch) decodes every image with PIL by design: no such line.
    result = RunResult(listed=4, classified=4, decoder_backends={"ffmpeg": 3, "pil": 1})
    spdl, torch_loader = io.StringIO(), io.StringIO()
    _print_summary(result, spdl)
    _print_summary(result, torch_loader, pil_loader=True)
    assert "  1 image (25.0%) decoded by PIL, not FFmpeg: not JPEG or PNG, an animated PNG," in spdl.getvalue()
    assert "decoded by PIL" not in torch_loader.getvalue()


def test_breakdown_bound_and_efficiency_by_hand():
    # The bound is the slower side alone; on the CPU the rate of taking turns is 1 / (1/600 + 1/40).
    cpu = _Breakdown.from_rates(600.0, 40.0, 30.0, torch.device("cpu"))
    assert (cpu.bound_fps, cpu.bottleneck, cpu.efficiency, cpu.shared_fps) == (40.0, "model", 0.75, 37.5)
    cpu = _Breakdown.from_rates(40.0, 600.0, 36.0, torch.device("cpu"))
    assert (cpu.loader_fps, cpu.model_fps, cpu.e2e_fps) == (40.0, 600.0, 36.0)
    assert (cpu.bound_fps, cpu.bottleneck, cpu.efficiency, cpu.shared_fps) == (40.0, "loader", 0.9, 37.5)
    slow = _Breakdown.from_rates(0.5, 0.5, 0.2, torch.device("cpu"))  # under one image/s: still a rate
    assert (slow.shared_fps, slow.efficiency) == (0.25, 0.4)
    exact = io.StringIO()  # exactly the bound: no note
    _print_breakdown(_Breakdown.from_rates(40.0, 600.0, 40.0, torch.device("cuda", 0)), exact)
    assert exact.getvalue().splitlines()[1] == "Bound 40.0 images/s, set by the loader; end-to-end reaches 100% of it"
    gpu = _Breakdown.from_rates(3000.0, 1200.0, 900.0, torch.device("cuda", 0))
    assert (gpu.bound_fps, gpu.bottleneck, gpu.efficiency) == (1200.0, "model", 0.75)
    gpu = _Breakdown.from_rates(1200.0, 3000.0, 900.0, torch.device("cuda", 0))
    assert (gpu.bound_fps, gpu.bottleneck, gpu.efficiency) == (1200.0, "loader", 0.75)
    for loader_fps, model_fps in ((0.0, 40.0), (40.0, 0.0)):  # a side that timed nothing: no bound
        none = _Breakdown.from_rates(loader_fps, model_fps, 30.0, torch.device("cpu"))
        assert (none.bound_fps, none.efficiency, none.shared_fps) == (0.0, 0.0, 0.0)
    printed = io.StringIO()
    _print_breakdown(cpu, printed)
    assert printed.getvalue().splitlines() == [
        "Breakdown (images/s): loader alone 40.0 | model alone 600.0 | end-to-end 36.0",
        "Bound 40.0 images/s, set by the loader; end-to-end reaches 90% of it",
        "On the CPU the two share the cores: taking turns, with no overlap, they would reach 37.5 images/s",
    ]
    over = io.StringIO()  # a figure above 100 % says what it is
    _print_breakdown(_Breakdown.from_rates(40.0, 600.0, 41.0, torch.device("cuda", 0)), over)
    assert over.getvalue().splitlines()[1] == (
        "Bound 40.0 images/s, set by the loader; end-to-end reaches 102% of it "
        "(above 100 %: measurement noise, or a window too short for the loader's buffer or its drain)"
    )


# --- Geometry, against timm's own evaluation transform ----------------------------------------

# (size, crop_pct) of common timm configs, read from timm below; size / crop_pct of several has a
# fraction of .5 or more, where rounding and flooring the shorter side differ.
TIMM_CONFIGS = [
    "mobilenetv3_large_100.ra_in1k",  # 224 / 0.875 = 256
    "resnet50.a1_in1k",  # 224 / 0.95 = 235.79
    "vit_base_patch16_224.augreg2_in21k_ft_in1k",  # 224 / 0.9 = 248.89
    "inception_v3.tv_in1k",  # 299 / 0.875 = 341.71
    "tf_efficientnet_b3.ns_jft_in1k",  # 300 / 0.904 = 331.86
    "tf_efficientnet_b6.ns_jft_in1k",  # 528 / 0.942 = 560.51
    "convnext_tiny.fb_in1k",  # 224 / 0.875
    "deit_small_patch16_224.fb_in1k",  # 224 / 0.875
    "test_efficientnet.r160_in1k",  # 160 / 0.95 = 168.42
]


def _config(name: str) -> tuple[int, float]:
    cfg = timm.models.get_pretrained_cfg(name)
    return cfg.input_size[-1], cfg.crop_pct


def _input_sizes(short: int) -> list[tuple[int, int]]:
    """Input sizes for a resized shorter side ``short``: ImageNet's common ones, and ones whose
    long side resizes to a fraction of exactly .5 (k + 0.5 with k odd, which round() and int()
    take to different sides) or of .75."""
    half = 2 * short + (3 if short % 2 == 0 else 1)  # short * half / (2 * short) = k + 0.5, k odd
    three_quarters = 4 * short + 3  # short * (4 * short + 3) / (4 * short) = short + 0.75
    return [(500, 375), (375, 500), (500, 333), (640, 427), (32, 24), (8, 8), (4000, 60),
            (2 * short, half), (half, 2 * short), (4 * short, three_quarters), (three_quarters, 4 * short)]  # fmt: skip


def _timm_geometry(size: int, crop_pct: float, width: int, height: int) -> tuple[int, int, int, int]:
    """``(resized width, resized height, crop left, crop top)``, read off timm's transform: the size
    its Resize gives an image, and the crop box its CenterCrop cuts from an image whose pixels
    hold their own coordinates."""
    transform = timm.data.create_transform(input_size=(3, size, size), crop_pct=crop_pct, interpolation="bicubic")
    resize, crop = transform.transforms[:2]
    assert type(resize).__name__ == "Resize" and type(crop).__name__ == "CenterCrop", transform
    new_h, new_w = resize(torch.zeros(1, height, width)).shape[-2:]
    coordinates = torch.arange(new_h * new_w).view(1, new_h, new_w)
    box = crop(coordinates)
    assert box.shape[-2:] == (size, size)
    top, left = divmod(int(box[0, 0, 0]), new_w)
    assert int(box[0, -1, -1]) == (top + size - 1) * new_w + left + size - 1
    return new_w, new_h, left, top


@pytest.mark.parametrize("name", TIMM_CONFIGS)
def test_geometry_matches_timms_transform(name):
    size, crop_pct = _config(name)
    short = math.floor(size / crop_pct)
    for width, height in _input_sizes(short):
        ours = EvalTransform(size=size, crop_pct=crop_pct).geometry(width, height)
        assert ours == _timm_geometry(size, crop_pct, width, height), (size, crop_pct, width, height)


def test_geometry_cases_reach_the_fractions_that_tell_roundings_apart():
    # The cases above would not catch a changed rounding unless they reach these fractions.
    shorts = [size / crop_pct for size, crop_pct in map(_config, TIMM_CONFIGS)]
    assert any(s % 1 >= 0.5 for s in shorts) and any(0 < s % 1 < 0.5 for s in shorts)
    longs, offsets = [], []
    for size, crop_pct in map(_config, TIMM_CONFIGS):
        short = math.floor(size / crop_pct)
        for width, height in _input_sizes(short):
            long_side = short * max(width, height) / min(width, height)
            longs.append(long_side % 1)
            offsets += [(short - size) / 2 % 2, (math.floor(long_side) - size) / 2 % 2]
    assert 0.5 in longs and any(f > 0.5 for f in longs)
    assert 0.5 in offsets and 1.5 in offsets  # centre-crop offsets of k + 0.5, k even and k odd


def test_geometry_refuses_an_empty_image():
    for width, height in ((0, 10), (10, 0), (0, 0), (-1, 10)):
        with pytest.raises(ValueError, match="invalid image size"):
            EvalTransform().geometry(width, height)
    assert EvalTransform().geometry(1, 1) == _timm_geometry(224, 0.875, 1, 1)


def test_resize_region_stays_in_the_frame_and_samples_where_the_whole_frame_would():
    # A sweep over sizes for the common configs: the region (when there is one) lies in the frame,
    # with even start and length, and its crop samples the source within 0.06 px of where the
    # whole frame's would: at (offset + k + 0.5) * length / resized - 0.5 for crop pixel k.
    regions = 0
    for size, crop_pct in map(_config, TIMM_CONFIGS):
        for width in range(size // 2, 1100, 37):
            for height in range(size // 2, 1100, 41):
                new_w, new_h, left, top = _timm_geometry_fast(size, crop_pct, width, height)
                for length, resized, offset in ((width, new_w, left), (height, new_h, top)):
                    start, src_len, out, pad = _resize_region(length, resized, offset, size)
                    if (start, src_len, out, pad) == (0, length, resized, offset):
                        continue  # the whole side
                    regions += 1
                    where = (size, crop_pct, width, height, length, (start, src_len, out, pad))
                    assert 0 <= start and start + src_len <= length and start % 2 == src_len % 2 == 0, where
                    assert pad >= 4 and out - pad - size >= 4, where
                    for k in (0, size - 1):  # the error is linear in k: its ends bound it
                        ours = start + (pad + k + 0.5) * src_len / out
                        whole = (offset + k + 0.5) * length / resized
                        assert abs(ours - whole) <= 0.06, where
    assert regions > 3000  # 3862 sides of the sweep are cut to a region: it reaches them


def _timm_geometry_fast(size: int, crop_pct: float, width: int, height: int) -> tuple[int, int, int, int]:
    """timm's geometry as :py:func:`_timm_geometry` reads it, by hand, for a sweep: timm's shorter
    side ``floor(size / crop_pct)``, torchvision's long side truncated and centre-crop offsets
    rounded half to even. test_geometry_matches_timms_transform checks these against timm."""
    short = math.floor(size / crop_pct)
    long_side = int(short * max(width, height) / min(width, height))
    new_w, new_h = (short, long_side) if width <= height else (long_side, short)
    return new_w, new_h, round((new_w - size) / 2), round((new_h - size) / 2)


@pytest.mark.parametrize("width, height", [(331, 276), (268, 356), (315, 321), (500, 375)])
def test_decoded_pixels_match_timms_transform(tmp_path, width, height):
    # Sizes where the region FFmpeg resizes is cut on one side and whole on the other. The
    # reference is timm's own evaluation transform (PIL, bicubic) on the same decoded photo.
    from make_demo_data import PHOTOS, photo_path

    photo = Image.open(photo_path(next(iter(PHOTOS)))).convert("RGB").resize((width, height), Image.Resampling.LANCZOS)
    path = tmp_path / "n01440764" / "photo.JPEG"
    path.parent.mkdir()
    photo.save(path, quality=95)
    images, _ = get_decode_func("cpu", EvalTransform())([(str(path), 0)])
    timm_eval = timm.data.create_transform(input_size=(3, 224, 224), crop_pct=0.875, interpolation="bicubic")
    resize, crop = timm_eval.transforms[:2]
    with Image.open(path) as decoded:
        reference = np.asarray(crop(resize(decoded.convert("RGB"))), dtype=np.int16)
    mad = np.abs(images[0].permute(1, 2, 0).numpy().astype(np.int16) - reference).mean()
    assert 0 < mad < 1.2, mad  # tests/test_decode.py's PIL_PARITY_MAD


def test_model_config_reaches_the_transform():
    model = timm.create_model("test_efficientnet", pretrained=False)
    cfg = timm.data.resolve_data_config({}, model=model)
    t = EvalTransform.from_model(model)
    assert (t.size, t.crop_pct, t.interpolation) == (cfg["input_size"][-1], cfg["crop_pct"], cfg["interpolation"])
    assert (t.mean, t.std) == (tuple(cfg["mean"]), tuple(cfg["std"]))
    assert t.geometry(200, 150) == _timm_geometry(160, 0.95, 200, 150)
