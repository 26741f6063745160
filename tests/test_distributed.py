"""torchrun on the CPU with Gloo: exact totals over shards, and a failing rank stops them all."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from imagenet_classification import _Shard, source
from tests.conftest import ROOT, TINY, make_jpeg_set, read_json, run_cli


def _args(flist: Path, checkpoint: Path, out: Path, *extra: str) -> list[str]:
    return ["--input-flist", str(flist), "--prefix", f"{flist.parent}/", "--model", "efficientnet_lite0",
            "--checkpoint", str(checkpoint), "--device", "cpu", "--no-compile", "--no-bf16", "--batch-size", "4",
            "--num-threads", "1", "--warmup-batches", "1", "--results-file", str(out), *extra]  # fmt: skip


def _odd_list(demo_photos: Path, root: Path) -> Path:
    """A private copy of the first 19 photos (an odd count), which a test may damage."""
    shutil.copytree(demo_photos.parent / "val", root / "val")
    flist = root / "odd.flist"
    flist.write_text("\n".join(demo_photos.read_text().splitlines()[:19]) + "\n")
    return flist


def test_shards_cover_every_line_once(jpeg_set):
    everything = list(source(jpeg_set))
    for world in (2, 3, 7):
        shards = [list(source(jpeg_set, rank=r, world_size=world)) for r in range(world)]
        assert sorted(item for shard in shards for item in shard) == sorted(everything)
        assert [len(s) for s in shards] == [_Shard(r, world).size_of(len(everything)) for r in range(world)]


def test_torchrun_totals_equal_a_single_process(demo_photos, lite0_checkpoint, tmp_path):
    flist = _odd_list(demo_photos, tmp_path)
    single = run_cli(*_args(flist, lite0_checkpoint, tmp_path / "one.json"))
    assert single.returncode == 0, single.stderr
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd = [*launcher, str(ROOT / "imagenet_classification.py"), *_args(flist, lite0_checkpoint, tmp_path / "two.json"),
           "--predictions-file", str(tmp_path / "p.jsonl")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("Images: listed=19 classified=19") == 1  # rank 0 alone reports
    one, two = read_json(tmp_path / "one.json"), read_json(tmp_path / "two.json")
    for key in ("listed", "classified", "failed", "not_reached", "top1_correct", "top5_correct"):
        assert one[key] == two[key], key
    assert two["listed"] == 19 and two["world_size"] == 2
    assert sorted(r["classified"] for r in two["ranks"]) == [9, 10]
    assert two["frames_timed"] == sum(r["classified"] - 4 for r in two["ranks"])  # one warm-up batch each
    assert two["elapsed_s"] == max(r["elapsed_s"] for r in two["ranks"])
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]  # every rank's, on rank 0
    assert sorted(row["path"] for row in rows) == sorted(f"{flist.parent}/{line}" for line in flist.read_text().split())
    assert sum(row["correct1"] for row in rows) == two["top1_correct"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_failing_rank_stops_every_rank(demo_photos, lite0_checkpoint, tmp_path):
    flist = _odd_list(demo_photos, tmp_path)
    lines = flist.read_text().splitlines()
    (flist.parent / lines[1]).write_bytes(b"not a JPEG at all" * 20)  # line index 1 falls to rank 1
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    procs = []
    started = time.monotonic()
    for rank in (0, 1):
        cmd = [sys.executable, str(ROOT / "imagenet_classification.py"),
               *_args(flist, lite0_checkpoint, tmp_path / f"r{rank}.json", "--timeout", "15")]  # fmt: skip
        rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        procs.append(subprocess.Popen(cmd, env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=120) for p in procs]
    assert time.monotonic() - started < 90
    assert [p.returncode for p in procs] == [1, 1], outputs
    assert f"error: rank 1: cannot decode {flist.parent / lines[1]}" in outputs[1][1]
    assert "error: rank 0: another rank stopped" in outputs[0][1]
    cache = read_json(tmp_path / "r0.json")["page_cache"]  # every rank's, examined before the stop: not lost
    assert cache is not None and cache["files"] + cache["repeats"] + cache["skipped"] == 19


def test_max_bad_is_the_jobs_limit_not_each_ranks(tmp_path):
    # 20 images, 3 of them bad: lines 2 and 4 fall to rank 0, line 3 to rank 1. --max-bad 10% is 2
    # images of the job's 20: rank 0's 2 are within it (a share of its shard, 10, would be 1, and
    # would stop it), but the job's 3 are not, though each rank alone kept to the limit.
    flist = make_jpeg_set(tmp_path, 20)
    lines = flist.read_text().splitlines()
    for i in (2, 3, 4):
        (tmp_path / lines[i]).write_bytes(b"not a JPEG at all" * 20)
    out = tmp_path / "r.json"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd = [*launcher, str(ROOT / "imagenet_classification.py"), "--input-flist", str(flist), "--prefix",
           f"{tmp_path}/", *TINY, "--no-compile", "--batch-size", "4", "--warmup-batches", "0", "--skip-bad",
           "--max-bad", "10%", "--results-file", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr
    assert "Images: listed=20 classified=17 failed=3 not_reached=0" in proc.stdout
    message = "the job's ranks skipped 3 images that failed to decode, more than --max-bad allows (2) in the whole job"
    assert proc.stderr.count(f"error: {message}") == 1, proc.stderr
    result = read_json(out)
    assert (result["failed"], result["partial"], result["stop_reason"]) == (3, False, message)


def test_a_list_shorter_than_the_ranks_or_their_threads_runs(tmp_path):
    # 3 images: shards of 2 and 1, --num-threads 2 capped at each rank's own (2 and 1) was refused as
    # "the ranks were given different settings"; 1 image: rank 1 has none, and padding to 0 images
    # ended it with a traceback.
    flist = make_jpeg_set(tmp_path, 3)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    for count in (3, 1):
        out = tmp_path / f"r{count}.json"
        cmd = [*launcher, str(ROOT / "imagenet_classification.py"), "--input-flist", str(flist), "--prefix",
               f"{tmp_path}/", *TINY, "--no-compile", "--batch-size", "4", "--warmup-batches", "0",
               "--max-samples", str(count), "--results-file", str(out)]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        result = read_json(out)
        assert (result["listed"], result["classified"], result["not_reached"]) == (count, count, 0)
        assert sorted(r["classified"] for r in result["ranks"]) == sorted([(count + 1) // 2, count // 2])
        assert result["config"]["num_threads"] == min(2, (count + 1) // 2)
        assert result["config"]["batch_size"] == (count + 1) // 2  # rank 0's share, not the 3 listed
