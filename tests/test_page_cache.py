"""--cold-cache and the read ceiling: real files on a disk-backed file system, evicted for real.

The files live under the project's own build/ folder (gitignored), not in pytest's tmp_path,
which may be on tmpfs, where eviction does nothing; a test that needs eviction to work first
checks that this file system honours it, and skips with the reason where it does not.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from imagenet_classification import (
    ImageList,
    _Breakdown,
    _examine_page_cache,
    _listed_first_elsewhere,
    _page_cache_lines,
    _PageCache,
    _print_breakdown,
    _Shard,
)
from tests.conftest import CLASSES, ROOT, TINY, label_colour, read_json, run_cli, run_main, write_jpeg


def _file_system(path: Path) -> str:
    """The type of the file system ``path`` is on, from /proc/mounts (the longest mount point)."""
    best, kind = "", "unknown"
    real = os.path.realpath(path)
    with open("/proc/mounts") as mounts:
        for line in mounts:
            point, fs = line.split()[1:3]
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, kind = point, fs
    return kind


def _write_synced(path: Path, data: bytes) -> Path:
    """A file whose pages are on disk, so that eviction can drop them (it drops clean pages only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return path


def _sync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            with open(path, "rb+") as f:
                os.fsync(f.fileno())


def _read_all(paths) -> None:
    for path in paths:
        Path(path).read_bytes()


@pytest.fixture
def disk_dir():
    """A fresh folder under build/ (on the worktree's own file system), removed afterwards."""
    folder = ROOT / "build" / f"test-page-cache-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def evicting_dir(disk_dir):
    """``disk_dir``, or a skip saying why eviction cannot be checked there."""
    if not hasattr(os, "posix_fadvise"):
        pytest.skip("no posix_fadvise on this platform")
    probe = _write_synced(disk_dir / "probe", os.urandom(256 << 10))
    probe.read_bytes()
    cache = _examine_page_cache([str(probe)], evict=True)
    probe.unlink()
    if cache.resident is None:
        pytest.skip("mincore cannot tell residency here")
    if cache.resident_after != 0.0:
        pytest.skip(f"the {_file_system(disk_dir)} file system at {disk_dir} ignores POSIX_FADV_DONTNEED "
                    f"({cache.resident_after:.0%} still resident after eviction)")  # fmt: skip
    return disk_dir


def test_eviction_empties_the_cache_and_the_share_is_of_bytes(evicting_dir):
    # Sizes that end mid-page, so that the share counts bytes, not pages.
    sizes = [10_000, 123_457, 4096 * 7 + 1, 1]
    paths = [str(_write_synced(evicting_dir / f"f{i}", os.urandom(n))) for i, n in enumerate(sizes)]
    _read_all(paths)
    warm = _examine_page_cache(paths)
    assert (warm.cold, warm.files, warm.skipped, warm.bytes) == (False, 4, 0, sum(sizes))
    assert warm.resident_bytes == sum(sizes) and warm.resident == 1.0 and warm.resident_after is None
    cold = _examine_page_cache(paths, evict=True)
    assert (cold.cold, cold.resident_bytes, cold.resident_after_bytes) == (True, sum(sizes), 0)
    assert _examine_page_cache(paths).resident_bytes == 0  # it stays out until read again
    Path(paths[1]).read_bytes()
    again = _examine_page_cache(paths)
    assert again.resident_bytes == sizes[1] and again.resident == sizes[1] / sum(sizes)


def test_a_file_listed_twice_or_linked_counts_once(evicting_dir):
    # A list repeated for a longer FPS window (as README advises), a hard link, a symbolic link: each
    # file once, as first met. Counted per line, the repeats had doubled the bytes and, evicted by
    # their first line, halved the share in memory before the run (50 % of a list wholly in memory).
    sizes = [10_000, 20_000]
    paths = [str(_write_synced(evicting_dir / f"f{i}", os.urandom(n))) for i, n in enumerate(sizes)]
    os.link(paths[0], evicting_dir / "hard")
    (evicting_dir / "soft").symlink_to(paths[1])
    _read_all(paths)
    cold = _examine_page_cache([*paths, *paths, str(evicting_dir / "hard"), str(evicting_dir / "soft")], evict=True)
    assert (cold.files, cold.skipped, cold.bytes, cold.resident, cold.resident_after) == (2, 0, 30_000, 1.0, 0.0)
    # The run reads the 4 repeats from memory, cold run or not: the summary says so.
    assert cold.repeats == 4 and _page_cache_lines(cold)[1] == (
        "  WARNING: 4 listed lines (67%) name a file listed before: those reads come from memory, not the disk "
        "(a cold run reads each file cold once)")  # fmt: skip


def test_ranks_that_share_files_count_each_once_and_none_evicts_it_first(evicting_dir):
    # A repeated list of odd length over 2 ranks: each file falls to both. The rank whose shard lists
    # it first examines and evicts it; the other counts its line as a repeat. Before, each rank
    # examined its own shard: the sum counted every file twice, and on one machine the rank that
    # evicted first left the other finding it evicted (a list wholly in memory read 50 %).
    paths = [str(_write_synced(evicting_dir / f"f{i}", os.urandom(5000))) for i in range(3)]
    _read_all(paths)
    listed = ImageList(tuple(paths * 2), (0,) * 6)  # ranks: 0 gets f0 f2 f1, 1 gets f1 f0 f2
    elsewhere = [_listed_first_elsewhere(listed, _Shard(rank, 2)) for rank in (0, 1)]
    assert elsewhere == [{paths[1]}, {paths[0], paths[2]}]
    caches = [_examine_page_cache(listed.shard(r, 2).paths, True, elsewhere[r]) for r in (0, 1)]
    total = _PageCache.total(caches)
    assert (total.files, total.bytes, total.repeats, total.resident, total.resident_after) == (3, 15000, 3, 1.0, 0.0)
    # A missing path listed twice: two lines the run fails, neither a repeat read from memory.
    missing = _examine_page_cache([str(evicting_dir / "missing")] * 2 + paths[:1], True)
    assert (missing.files, missing.skipped, missing.repeats) == (1, 2, 0)


def test_paths_that_are_no_regular_file_are_counted_not_fatal(disk_dir):
    good = _write_synced(disk_dir / "good", b"x" * 5000)
    fifo = disk_dir / "fifo"
    os.mkfifo(fifo)  # no writer: a blocking open would hang
    paths = [str(good), str(disk_dir / "missing"), str(fifo), str(disk_dir), "/dev/null"]
    cache = _examine_page_cache(paths, evict=hasattr(os, "posix_fadvise"))
    assert (cache.files, cache.skipped, cache.bytes) == (1, 4, 5000)
    said = "; 4 listed paths not examined (not opened as regular files, or over --max-image-mb)"
    assert said in _page_cache_lines(cache)[0]


@pytest.mark.skipif(_file_system(Path("/dev/shm")) != "tmpfs", reason="no tmpfs at /dev/shm")
def test_eviction_on_tmpfs_has_no_effect_and_the_summary_says_so():
    path = Path("/dev/shm") / f"test-page-cache-{uuid.uuid4().hex[:8]}"
    try:
        path.write_bytes(os.urandom(50_000))
        cache = _examine_page_cache([str(path)], evict=True)
    finally:
        path.unlink()
    assert cache.resident == 1.0 and cache.resident_after == 1.0  # tmpfs pages are the files themselves
    lines = _page_cache_lines(cache)
    assert lines[0] == ("Page cache: cold run (--cold-cache); before it, 100.0% of the listed 0.1 MB was in memory, "
                        "100.0% after eviction")  # fmt: skip
    assert lines[1].startswith("  WARNING: eviction had no effect: the file system ignores it (tmpfs")


def test_summary_lines_by_hand():
    warm = _PageCache(False, files=3, bytes=2_000_000, resident_bytes=500_000)
    assert _page_cache_lines(warm) == [
        "Page cache: warm run (no --cold-cache); before it, 25.0% of the listed 2.0 MB was in memory"
    ]
    partly = _PageCache(True, files=3, bytes=3_000_000_000, resident_bytes=3_000_000_000, resident_after_bytes=160e6)
    assert _page_cache_lines(partly)[0].endswith("100.0% of the listed 3.00 GB was in memory, 5.3% after eviction")
    assert _page_cache_lines(partly)[1].startswith("  WARNING: eviction left 5.3% of the bytes in memory")
    at_limit = _PageCache(True, files=3, bytes=1000, resident_bytes=1000, resident_after_bytes=50)  # 5 %: no warning
    assert len(_page_cache_lines(at_limit)) == 1
    unknown = _PageCache(True, files=3, bytes=1000, resident_bytes=None, resident_after_bytes=None)
    assert _page_cache_lines(unknown) == [
        "Page cache: cold run (--cold-cache); how much of the listed 0.0 MB was in memory is unknown (mincore could "
        "not tell)"
    ]
    total = _PageCache.total([_PageCache(True, 2, 1, 300, 200, 0), _PageCache(True, 3, 0, 700, 700, 10)])
    assert total == _PageCache(True, 5, 1, 1000, 900, 10) and total.resident_after == 0.01
    assert _PageCache.total([_PageCache(False, 1, 0, 5, None), _PageCache(False, 1, 0, 5, 5)]).resident is None


def test_the_disk_in_the_verdict_by_hand():
    cpu = torch.device("cpu")
    # Reading alone far faster than the loader: the loader's own work bounds it.
    fast = _Breakdown.from_rates(40.0, 600.0, 36.0, cpu, (1000.0, 50.0, 0.0, True))
    assert (fast.bound_fps, fast.bottleneck, fast.read_fps, fast.read_mb_s) == (40.0, "loader", 1000.0, 50.0)
    # The loader at 10 % below reading alone from the disk (not more): the reads set its pace.
    near = _Breakdown.from_rates(40.0, 600.0, 36.0, cpu, (44.0, 5.0, 0.0, True))
    assert (near.bound_fps, near.bottleneck, near.efficiency, near.read_cold) == (40.0, "disk", 0.9, True)
    assert _Breakdown.from_rates(40.0, 600.0, 36.0, cpu, (44.1, 5.0, 0.0, True)).bottleneck == "loader"
    # Reading alone slower than the loader that reads the same files: still the disk.
    assert _Breakdown.from_rates(40.0, 600.0, 36.0, cpu, (30.0, 3.0, 0.5, False)).bottleneck == "disk"
    # Residency unknown counts as the disk; files that were (nearly) all in memory do not.
    assert _Breakdown.from_rates(40.0, 600.0, 36.0, cpu, (42.0, 5.0, None, True)).bottleneck == "disk"
    assert _Breakdown.from_rates(40.0, 600.0, 36.0, cpu, (42.0, 5.0, 0.949, False)).bottleneck == "disk"
    assert _Breakdown.from_rates(40.0, 600.0, 36.0, cpu, (42.0, 5.0, 0.95, False)).bottleneck == "loader"
    # The model the slower side: the model, whatever the reads.
    assert _Breakdown.from_rates(600.0, 40.0, 36.0, cpu, (41.0, 5.0, 0.0, True)).bottleneck == "model"
    # A read pass that read nothing (every file refused) says nothing about the disk.
    assert _Breakdown.from_rates(40.0, 600.0, 36.0, cpu, (0.0, 0.0, 0.0, True)).bottleneck == "loader"
    tie = io.StringIO()  # the loader as fast as reading alone: the disk sets its pace
    _print_breakdown(_Breakdown.from_rates(40.0, 600.0, 36.0, cpu, (40.0, 4.0, 0.0, True)), tie)
    assert "The loader runs at 100% of reading alone: the disk sets its pace" in tie.getvalue()
    # However slow: a disk that reads half an image a second sets the pace of a loader at 0.52.
    assert _Breakdown.from_rates(0.52, 600.0, 0.5, cpu, (0.5, 0.1, 0.0, True)).bottleneck == "disk"
    printed = io.StringIO()
    _print_breakdown(near, printed)
    assert printed.getvalue().splitlines() == [
        "Breakdown (images/s): loader alone 40.0 | model alone 600.0 | end-to-end 36.0",
        "Reading alone (the loader's reads, as many batches at once, no decode; cold: 0.0% of the bytes in memory): "
        "44.0 images/s, 5.0 MB/s",
        "Bound 40.0 images/s, set by the disk; end-to-end reaches 90% of it",
        "The loader runs at 91% of reading alone: the disk sets its pace, not the decode (more threads help only "
        "while the disk has bandwidth to spare)",
        "On the CPU the two share the cores: taking turns, with no overlap, they would reach 37.5 images/s",
    ]
    slower = io.StringIO()
    _print_breakdown(_Breakdown.from_rates(40.0, 600.0, 36.0, torch.device("cuda", 0), (30.0, 3.0, None, True)), slower)
    assert slower.getvalue().splitlines()[1:] == [
        "Reading alone (the loader's reads, as many batches at once, no decode; cold: unknown of the bytes in "
        "memory): 30.0 images/s, 3.0 MB/s",
        "Bound 40.0 images/s, set by the disk; end-to-end reaches 90% of it",
        "Reading alone was slower than the loader, which reads the same files: the disk's rate changed between the "
        "passes (other readers, pages cached in between)",
    ]


def _mixed_set(root: Path) -> tuple[Path, list[Path], list[Path]]:
    """12 JPEGs, a text file, a truncated JPEG and a missing file, synced to disk; returns the
    list, the files reading accepts (the JPEGs and the text) and every existing file."""
    wnids = list(CLASSES)
    lines, readable = [], []
    for i in range(12):
        wnid = wnids[i % len(wnids)]
        rel = f"val/{wnid}/img_{i:02d}.JPEG"
        write_jpeg(root / rel, ((320, 240), (240, 320))[i % 2], label_colour(CLASSES[wnid]), seed=i)
        lines.append(rel)
        readable.append(root / rel)
    (root / "val/n01440764/text.JPEG").write_text("<html>not an image</html>\n" * 40)
    readable.append(root / "val/n01440764/text.JPEG")
    jpeg = (root / lines[0]).read_bytes()
    (root / "val/n01440764/truncated.JPEG").write_bytes(jpeg[: len(jpeg) // 2])
    lines[3:3] = ["val/n01440764/text.JPEG", "val/n01440764/truncated.JPEG", "val/n01440764/missing.JPEG"]
    flist = root / "val.flist"
    flist.write_text("\n".join(lines) + "\n")
    _sync_tree(root)
    return flist, readable, [*readable, root / "val/n01440764/truncated.JPEG"]


ACCOUNTING = ("listed", "classified", "failed", "not_reached", "top1_correct", "top5_correct", "top1", "top5",
              "frames_timed", "batches", "partial")  # fmt: skip


def test_a_cold_run_evicts_reports_the_read_ceiling_and_counts_the_same(evicting_dir, capfd):
    flist, readable, existing = _mixed_set(evicting_dir)
    common = ["--input-flist", flist, "--prefix", f"{evicting_dir}/", *TINY, "--no-compile", "--batch-size", "4",
              "--warmup-batches", "0", "--skip-bad", "--breakdown"]  # fmt: skip
    _read_all(existing)  # warm, so that the eviction has something to drop
    # In this process: what the runs report is checked, not the process.
    torch.manual_seed(0)  # the same random weights in both runs: their accuracies compare
    warm = run_main(capfd, *common, "--results-file", evicting_dir / "warm.json")
    assert warm.returncode == 0, warm.stderr
    torch.manual_seed(0)
    cold = run_main(capfd, *common, "--cold-cache", "--results-file", evicting_dir / "cold.json")
    assert cold.returncode == 0, cold.stderr
    w, c = read_json(evicting_dir / "warm.json"), read_json(evicting_dir / "cold.json")
    # The accounting, and accuracy's denominators, do not depend on the cache.
    assert [w[k] for k in ACCOUNTING] == [c[k] for k in ACCOUNTING]
    assert (c["listed"], c["classified"], c["failed"], c["not_reached"]) == (15, 12, 3, 0)
    assert sorted(Path(f["path"]).name for f in c["failures"]) == ["missing.JPEG", "text.JPEG", "truncated.JPEG"]
    size = sum(p.stat().st_size for p in existing)
    assert w["page_cache"] == {"cold": False, "files": 14, "skipped": 1, "bytes": size,
                               "resident_bytes": size, "resident_after_bytes": None, "repeats": 0, "resident": 1.0,
                               "resident_after": None}  # fmt: skip
    assert c["page_cache"] == {"cold": True, "files": 14, "skipped": 1, "bytes": size,
                               "resident_bytes": size, "resident_after_bytes": 0, "repeats": 0, "resident": 1.0,
                               "resident_after": 0.0}  # fmt: skip
    assert c["config"]["cold_cache"] is True and w["config"]["cold_cache"] is False
    line = (f"Page cache: cold run (--cold-cache); before it, 100.0% of the listed {size / 1e6:.1f} MB was in memory, "
            "0.0% after eviction; 1 listed path not examined (not opened as regular files, or over "
            "--max-image-mb)")  # fmt: skip
    assert line in cold.stdout.splitlines()
    assert "WARNING: eviction" not in cold.stdout
    # The read ceiling: with no warm-up, every readable file's bytes over as many images.
    read_bytes = sum(p.stat().st_size for p in readable)
    for result, run, state in ((w, warm, "warm: 100.0%"), (c, cold, "cold: 0.0%")):
        b = result["breakdown"]
        assert b["read_fps"] > 0 and b["read_cold"] is (result is c)
        assert b["read_mb_s"] * 1e6 / b["read_fps"] == pytest.approx(read_bytes / len(readable), rel=1e-9)
        assert b["read_resident"] == (0.0 if result is c else 1.0)
        assert b["bound_fps"] == min(b["loader_fps"], b["model_fps"])
        read = (f"Reading alone (the loader's reads, as many batches at once, no decode; {state} of the bytes in "
                f"memory): {b['read_fps']:.1f} images/s, {b['read_mb_s']:.1f} MB/s")  # fmt: skip
        assert read in run.stdout.splitlines()


def test_cold_cache_under_torchrun_sums_every_rank_s_shard(demo_photos, lite0_checkpoint, tmp_path):
    flist = tmp_path / "demo.flist"
    flist.write_text("\n".join(demo_photos.read_text().splitlines()[:11]) + "\n")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd = [*launcher, str(ROOT / "imagenet_classification.py"), "--input-flist", str(flist), "--prefix",
           f"{demo_photos.parent}/", "--model", "efficientnet_lite0", "--checkpoint", str(lite0_checkpoint),
           "--device", "cpu", "--no-compile", "--batch-size", "4", "--num-threads", "1", "--cold-cache",
           "--results-file", str(tmp_path / "r.json")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    r = read_json(tmp_path / "r.json")
    size = sum((demo_photos.parent / line).stat().st_size for line in flist.read_text().split())
    cache = r["page_cache"]
    assert (cache["cold"], cache["files"], cache["skipped"], cache["bytes"]) == (True, 11, 0, size)
    assert r["classified"] == 11 and proc.stdout.count("Page cache: cold run (--cold-cache)") == 1


def test_a_cold_run_of_a_folder(evicting_dir, capfd):
    _, _, existing = _mixed_set(evicting_dir)
    _read_all(existing)
    out = evicting_dir / "r.json"  # in this process: what the run reports is checked, not the process
    proc = run_main(capfd, "--data-dir", evicting_dir / "val", *TINY, "--no-compile", "--batch-size", "4",
                    "--skip-bad", "--cold-cache", "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = read_json(out)
    size = sum(p.stat().st_size for p in existing)
    assert (r["listed"], r["classified"], r["failed"]) == (14, 12, 2)
    assert r["page_cache"] == {"cold": True, "files": 14, "skipped": 0, "bytes": size,
                               "resident_bytes": size, "resident_after_bytes": 0, "repeats": 0, "resident": 1.0,
                               "resident_after": 0.0}  # fmt: skip


def test_a_sweep_takes_no_cold_cache(jpeg_set):
    proc = run_cli("--input-flist", jpeg_set, "--prefix", f"{jpeg_set.parent}/", *TINY, "--sweep", "auto",
                   "--cold-cache")  # fmt: skip
    assert proc.returncode == 2 and "it takes no --cold-cache" in proc.stderr
