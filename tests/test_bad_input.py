"""Every way input can be bad: what the user sees, the exit status, and the accounting.

Each test matches a row of README.md's table "What happens with bad input".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from make_unusual_images import make_unusual_images
from PIL import Image

from tests.conftest import ROOT, TINY, make_jpeg_set, read_json, run_cli, write_jpeg

FAST = [*TINY, "--no-compile", "--batch-size", "4"]


def _accounted(result: dict) -> bool:
    return result["classified"] + result["failed"] + result["not_reached"] == result["listed"]


@pytest.fixture
def dataset(tmp_path) -> Path:
    """A fresh copy of a generated set that a test may damage: returns its file list."""
    return make_jpeg_set(tmp_path / "data", 12)


def _run(flist: Path, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_cli("--input-flist", flist, "--prefix", f"{flist.parent}/", *FAST, *args, timeout=timeout)


def _add(flist: Path, rel: str) -> Path:
    """Append a line to the list; return the path it names."""
    with open(flist, "a") as f:
        f.write(rel + "\n")
    return flist.parent / rel


# --- Checked before the model is built: exit status 2, one line, no traceback -------------


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda d: d.unlink(), "val.flist: no such file"),
        (lambda d: d.write_text("\n\n"), "the file list has no image paths"),
        (lambda d: d.write_bytes(b"\xff\xfe\x00bad"), "val.flist:1: binary data"),
        (lambda d: d.write_bytes(b"val/n01440764/\xff.JPEG\n"), "val.flist:1: not UTF-8 text"),
        (lambda d: d.write_text("val/n01440764/a.JPEG\nval/cat.JPEG\n"), ":2: no WordNet ID"),
        (lambda d: d.write_text("val/n01440764/a.JPEG\nval/n00000001/b.JPEG\n"), ":2: n00000001 is not one of"),
    ],
    ids=["missing", "empty", "not-text", "not-utf8", "no-wnid", "unknown-wnid"],
)
def test_bad_file_list(dataset, setup, message):
    setup(dataset)
    proc = _run(dataset)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_wrong_prefix(dataset, tmp_path):
    proc = run_cli("--input-flist", dataset, "--prefix", f"{tmp_path}/elsewhere/", *FAST)
    assert proc.returncode == 2 and "no such folder" in proc.stderr
    proc = run_cli("--input-flist", dataset, "--prefix", f"{tmp_path}/", *FAST)
    assert proc.returncode == 2 and "does not exist: is --prefix right?" in proc.stderr


def test_bad_checkpoint_and_outputs(dataset, tmp_path):
    proc = _run(dataset, "--checkpoint", tmp_path / "none.pth")
    assert proc.returncode == 2 and "--checkpoint" in proc.stderr and "no such file" in proc.stderr
    proc = _run(dataset, "--results-file", tmp_path / "no" / "r.json")
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    proc = _run(dataset, "--results-file", tmp_path)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr
    proc = _run(dataset, "--trace", tmp_path / "no" / "t")
    assert proc.returncode == 2 and "--trace" in proc.stderr


def test_pretrained_weights_unreachable(dataset):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(dataset.parent / "hf")}
    cmd = [sys.executable, str(ROOT / "imagenet_classification.py"), "--input-flist", str(dataset),
           "--prefix", f"{dataset.parent}/", "--model", "test_efficientnet", "--device", "cpu",
           "--no-compile"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2 and "cannot get its pretrained weights" in proc.stderr
    assert "(HF_HUB_OFFLINE is set, and they are not in its cache)" in proc.stderr  # was "(OSError, and …)"
    assert "--checkpoint" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_hub_out_of_reach_is_one_line_without_retries(dataset):
    # No HF_HUB_OFFLINE: the hub's address refuses connections (port 9 on this machine), and the
    # cache is empty. One connection attempt says so, instead of a minute of retries.
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(dataset.parent / "hf-empty")}
    env = {k: v for k, v in env.items() if k not in ("HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy")}
    cmd = [sys.executable, str(ROOT / "imagenet_classification.py"), "--input-flist", str(dataset),
           "--prefix", f"{dataset.parent}/", "--model", "test_efficientnet", "--device", "cpu",
           "--no-compile"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the model hub is out of reach (127.0.0.1:" in errors[0]
    assert "Retry" not in proc.stderr and "Traceback" not in proc.stderr


# --- Images that must decode -----------------------------------------------------------------


def test_unusual_but_valid_images_decode(dataset):
    root = dataset.parent
    for path in make_unusual_images(root / "val/n01440764"):
        _add(dataset, str(path.relative_to(root)))
    image = Image.new("RGB", (300, 200), (20, 140, 60))
    (root / "val/n01440764/with space").mkdir()
    image.save(_add(dataset, "val/n01440764/with space/naïve café 猫.JPEG"))
    out = dataset.parent / "r.json"
    proc = _run(dataset, "--results-file", out)
    assert proc.returncode == 0, proc.stderr
    result = read_json(out)
    assert (result["listed"], result["classified"], result["failed"]) == (23, 23, 0)


# --- Images that cannot be used: strict stops, --skip-bad counts -----------------------------


def _write_bad_images(dataset: Path) -> dict[str, str]:
    """Add one image of each unusable kind; returns {path: expected words in the reason}."""
    root = dataset.parent
    good = (root / dataset.read_text().splitlines()[0]).read_bytes()
    bad = {
        _add(dataset, "val/n01440764/missing.JPEG"): "No such file",
        _add(dataset, "val/n01440764/zero.JPEG"): "empty file",
        _add(dataset, "val/n01440764/text.JPEG"): "not an image",
        _add(dataset, "val/n01440764/truncated.JPEG"): "truncated JPEG",
        _add(dataset, "val/n01440764/folder.JPEG"): "is a directory",
    }
    paths = list(bad)
    paths[1].write_bytes(b"")
    paths[2].write_text("<html>not an image</html>\n" * 40)
    paths[3].write_bytes(good[: len(good) // 2])
    paths[4].mkdir()
    return {str(p): words for p, words in bad.items()}


def test_strict_stops_at_first_bad_image(dataset):
    bad = _write_bad_images(dataset)
    out = dataset.parent / "r.json"
    proc = _run(dataset, "--results-file", out)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    result = read_json(out)
    assert result["partial"] is True and result["failed"] >= 1 and _accounted(result)
    first = result["failures"][0]
    assert bad[first["path"]] in first["reason"]
    assert f"error: cannot decode {first['path']}: {first['reason']}" in proc.stderr


def test_skip_bad_counts_and_lists_every_bad_image(dataset):
    bad = _write_bad_images(dataset)
    out = dataset.parent / "r.json"
    proc = _run(dataset, "--skip-bad", "--results-file", out)
    assert proc.returncode == 0, proc.stderr
    result = read_json(out)
    assert (result["listed"], result["classified"], result["failed"], result["not_reached"]) == (17, 12, 5, 0)
    assert {f["path"]: f["reason"] for f in result["failures"]}.keys() == bad.keys()
    for failure in result["failures"]:
        assert bad[failure["path"]] in failure["reason"]
    assert result["top1"] == pytest.approx(result["top1_correct"] / 12)
    assert "(PARTIAL RUN)" not in proc.stdout and ", 5 failed to decode)" in proc.stdout


def test_permission_denied_is_reported(dataset):
    # Root reads any file: drop the capabilities that let it, so the mode bits apply.
    secret = _add(dataset, "val/n01440764/secret.JPEG")
    write_jpeg(secret, (64, 64), (10, 20, 30))
    secret.chmod(0)
    out = dataset.parent / "r.json"
    cmd = [sys.executable, str(ROOT / "imagenet_classification.py"), "--input-flist", str(dataset),
           "--prefix", f"{dataset.parent}/", *FAST, "--skip-bad", "--results-file", str(out)]  # fmt: skip
    if os.geteuid() == 0:
        drop = "-dac_override,-dac_read_search"
        cmd = ["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert read_json(out)["failures"] == [{"path": str(secret), "reason": "Permission denied"}]


def test_max_bad_stops_the_run(dataset):
    _write_bad_images(dataset)
    out = dataset.parent / "r.json"
    proc = _run(dataset, "--skip-bad", "--max-bad", "2", "--results-file", out)
    assert proc.returncode == 1 and "more than --max-bad allows (2)" in proc.stderr
    result = read_json(out)
    assert result["failed"] > 2 and result["partial"] is True and _accounted(result)
    proc = _run(dataset, "--skip-bad", "--max-bad", "50%")
    assert proc.returncode == 0
    proc = _run(dataset, "--max-bad", "2")
    assert proc.returncode == 2 and "--max-bad only applies with --skip-bad" in proc.stderr


# --- Interrupts and stalls ---------------------------------------------------------------------


def _start(flist: Path, out: Path, *args) -> subprocess.Popen:
    cmd = [sys.executable, str(ROOT / "imagenet_classification.py"), "--input-flist", str(flist),
           "--prefix", f"{flist.parent}/", *FAST, "--results-file", str(out), *args]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_log(proc: subprocess.Popen, words: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if words in line:
            return
        assert line or proc.poll() is None, "the benchmark ended early"
    raise AssertionError(f"no log line with {words!r}")


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_signal_stops_quickly_with_partial_result(dataset, signum, status):
    lines = dataset.read_text().splitlines()
    dataset.write_text("\n".join(lines * 400) + "\n")  # 4800 images: far longer than the test waits
    out = dataset.parent / "r.json"
    proc = _start(dataset, out)
    _wait_for_log(proc, "images listed")
    time.sleep(2)
    sent = time.monotonic()
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=30)
    elapsed = time.monotonic() - sent
    assert proc.returncode == status, stderr
    assert elapsed < 2.0, elapsed
    assert f"interrupted by {signal.Signals(signum).name}" in stderr and "(PARTIAL RUN)" in stdout
    result = read_json(out)
    assert result["partial"] is True and 0 < result["classified"] < 4800 and result["not_reached"] > 0
    assert _accounted(result)


def test_stall_stops_with_exit_status_3_and_a_partial_result(dataset):
    # No batch within the time-out (here too short for any batch to be decoded in).
    out = dataset.parent / "r.json"
    proc = _run(dataset, "--timeout", "0.001", "--results-file", out, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "error: no batch for 0.001 s (--timeout): the decode stage " in proc.stderr
    result = read_json(out)
    assert result["partial"] is True and result["not_reached"] >= 1 and _accounted(result)


def test_a_fifo_device_or_oversized_file_is_refused_unread(dataset):
    # Listed by mistake, each would block the read (a FIFO) or be read forever (/dev/zero).
    fifo = _add(dataset, "val/n01440764/fifo.JPEG")
    os.mkfifo(fifo)
    os.symlink("/dev/zero", _add(dataset, "val/n01440764/zero-device.JPEG"))
    large = _add(dataset, "val/n01440764/large.JPEG")
    with open(large, "wb") as f:
        f.truncate(3 << 20)  # sparse: 3 MiB that take no disk
    out = dataset.parent / "r.json"
    proc = _run(dataset, "--skip-bad", "--max-image-mb", "2", "--results-file", out, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = read_json(out)
    reasons = {Path(f["path"]).name: f["reason"] for f in result["failures"]}
    assert reasons == {
        "fifo.JPEG": "is a FIFO, not an image file",
        "zero-device.JPEG": "is a device, not an image file",
        "large.JPEG": "file of 3.0 MiB, over the 2 MiB limit",
    }
    assert (result["classified"], result["failed"]) == (12, 3)


def test_failures_are_listed_in_the_lists_order_not_the_decode_order(tmp_path):
    # Batch 1 (a large photo, then a bad image) is still decoding when batch 2 (a bad image alone) is
    # done, and SPDL hands batches on as they complete: the failures are reported as the list has them.
    write_jpeg(tmp_path / "val/n01440764/big.JPEG", (6000, 4000), (90, 120, 150))
    for name in ("bad1", "bad2"):
        (tmp_path / f"val/n01440764/{name}.JPEG").write_bytes(b"")
    flist = tmp_path / "val.flist"
    flist.write_text("".join(f"val/n01440764/{name}.JPEG\n" for name in ("big", "bad1", "bad2")))
    out = tmp_path / "r.json"
    proc = run_cli("--input-flist", flist, "--prefix", f"{tmp_path}/", *TINY, "--no-compile", "--batch-size", "2",
                   "--skip-bad", "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [Path(f["path"]).name for f in read_json(out)["failures"]] == ["bad1.JPEG", "bad2.JPEG"]
    failed = [line for line in proc.stdout.splitlines() if line.startswith("  failed:")]
    assert [Path(line.split(": ")[1]).name for line in failed] == ["bad1.JPEG", "bad2.JPEG"], proc.stdout
    # The sweep's, too.
    proc = run_cli("--input-flist", flist, "--prefix", f"{tmp_path}/", *TINY, "--no-compile", "--sweep",
                   "num-threads=2", "batch-size=2", "--results-file", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [Path(f["path"]).name for f in read_json(out)["sweep"]["failures"]] == ["bad1.JPEG", "bad2.JPEG"]
    assert f"(the first: {tmp_path}/val/n01440764/bad1.JPEG: empty file (0 bytes);" in proc.stdout


def test_all_bad_list_reports_zero_classified(tmp_path):
    flist = tmp_path / "val.flist"
    flist.write_text("".join(f"val/n01440764/{i}.JPEG\n" for i in range(3)))
    (tmp_path / "val" / "n01440764").mkdir(parents=True)
    for i in range(3):
        (tmp_path / f"val/n01440764/{i}.JPEG").write_bytes(b"")
    out = tmp_path / "r.json"
    proc = run_cli("--input-flist", flist, "--prefix", f"{tmp_path}/", *FAST, "--skip-bad", "--results-file", out)
    assert proc.returncode == 0, proc.stderr
    result = read_json(out)
    assert (result["classified"], result["failed"], result["top1"], result["fps"]) == (0, 3, None, 0.0)
    # Said, and no warning about an FPS window that timed nothing (the loader's lead, its drain).
    assert "WARNING: no image was classified, 3 failed to decode: FPS and accuracy measure nothing" in proc.stdout
    assert "FPS window holds" not in proc.stdout and "after the loader" not in proc.stdout, proc.stdout
    assert (result["fps_max_overstatement"], result["fps_window_may_be_buffered"]) == (None, False)
    proc = run_cli("--input-flist", flist, "--prefix", f"{tmp_path}/", *FAST, "--skip-bad", "--breakdown",
                   "--parity", "3")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Breakdown cut short (the run timed no image: nothing to compare)" in proc.stdout
    assert "Bound" not in proc.stdout, proc.stdout  # no 'set by the loader' from a rate of no image
    assert "Parity with timm's reference transform: no image that both decoded, nothing compared" in proc.stdout
    assert "pixels differ" not in proc.stdout and proc.returncode == 0, proc.stdout  # not a parity of 0.00
    # A sweep recommends no setting, none having decoded an image (their rates, all 0, rank nothing).
    plot = tmp_path / "sweep.png"
    proc = run_cli("--input-flist", flist, "--prefix", f"{tmp_path}/", *FAST, "--sweep", "num-threads=1,2",
                   "--results-file", out, "--plot", plot)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "No setting to recommend: no setting decoded an image" in proc.stdout
    assert "The smallest setting" not in proc.stdout and plot.stat().st_size > 0
    sweep = read_json(out)["sweep"]
    assert sweep["recommended"] is None and [p["e2e_fps"] for p in sweep["points"]] == [None, None]
