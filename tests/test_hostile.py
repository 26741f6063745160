"""Hostile input, round two: every argument, every file read or written, every phase of a run.

Each test is a case from the hostile sweeps: a traceback, a lost result or a wrong image that
the command line must turn into a one-line error, a counted failure, or the right image.
"""

from __future__ import annotations

import io
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import imagenet_classification as ic
from tests.conftest import ROOT, TINY, make_jpeg_set, read_json, run_cli

FAST = [*TINY, "--no-compile", "--batch-size", "4"]
DATA = Path(__file__).parent / "data"


@pytest.fixture
def dataset(tmp_path) -> Path:
    return make_jpeg_set(tmp_path / "data", 12)


def _run(flist: Path, *args, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    return run_cli("--input-flist", flist, "--prefix", f"{flist.parent}/", *FAST, *args, timeout=timeout, **kwargs)


def _one_line_error(proc: subprocess.CompletedProcess, words: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if re.match(r"(imagenet_classification\.py: )?error:", line)]
    assert len(errors) == 1 and words in errors[0], proc.stderr


def _accounted(result: dict) -> bool:
    return result["classified"] + result["failed"] + result["not_reached"] == result["listed"]


def _cli(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "imagenet_classification.py"), *map(str, args)]


# --- A signal at any moment ----------------------------------------------------------------------


def test_a_signal_during_the_breakdown_keeps_the_finished_run(dataset, tmp_path):
    lines = dataset.read_text().splitlines()
    dataset.write_text("\n".join(lines * 40) + "\n")  # 480 images: the loader-alone pass takes a while
    out = tmp_path / "r.json"
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--warmup-batches", "1",
               "--breakdown", "--results-file", out)  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while "Breakdown: timing the loader alone" not in proc.stderr.readline():
        assert time.monotonic() < deadline and proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 143, stderr
    assert "Images: listed=480 classified=480 failed=0 not_reached=0" in stdout
    assert "Breakdown cut short (interrupted by SIGTERM)" in stdout and "(PARTIAL RUN)" not in stdout
    result = read_json(out)
    assert result["classified"] == 480 and result["partial"] is False
    assert result["breakdown_cut"] == "interrupted by SIGTERM" and "breakdown" not in result


def test_a_signal_while_the_libraries_load_is_one_line(dataset):
    proc = subprocess.Popen(_cli("--input-flist", dataset, *FAST), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    time.sleep(0.3)  # importing torch and SPDL takes seconds
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert stderr.strip().splitlines()[-1].startswith("error: interrupted by SIGINT") and "Traceback" not in stderr


# --- Files written ---------------------------------------------------------------------------------


def test_a_results_folder_removed_during_the_run_is_one_line_after_the_summary(dataset, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    lines = dataset.read_text().splitlines()
    dataset.write_text("\n".join(lines * 20) + "\n")
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--results-file", folder / "r.json")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while "images listed" not in proc.stderr.readline():
        assert proc.poll() is None
    folder.rmdir()
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "Images: listed=240 classified=240" in stdout
    _one_line_error(subprocess.CompletedProcess(cmd, 1, stdout, stderr), "cannot write the results there")
    assert "No such file or directory" in stderr and "leaked" not in stderr


def test_a_failed_write_leaves_the_old_results_whole(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    path.write_text('{"old": true}\n')
    report = ic.RunReport(ic.RunResult(listed=1, classified=1), {}, {}, [])

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        ic.write_results(path, report)
    assert path.read_text() == '{"old": true}\n' and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    monkeypatch.undo()
    ic.write_results(path, report)
    assert json.loads(path.read_text())["classified"] == 1


@pytest.mark.parametrize(
    "flag, target, words",
    [
        ("--results-file", "/dev/full", "not a regular file"),
        ("--results-file", "list", "is one of the run's inputs or outputs"),
        ("--results-file", "image", "is one of the run's inputs or outputs"),
        ("--predictions-file", "list", "is one of the run's inputs or outputs"),
        ("--results-file", "dangling", "does not exist"),
        ("--results-file", "fifo", "not a regular file"),
        ("--results-file", "long", "File name too long"),
        ("--trace", "", "not a file name"),
        ("--trace", "pftrace-folder", "not a regular file"),
        ("--predictions-file", "p.txt", "must end in .csv or .jsonl"),
        ("--checkpoint", "long", "File name too long"),
        ("--input-flist", "long", "File name too long"),
    ],
)
def test_files_the_run_writes_or_reads_are_checked_first(dataset, tmp_path, flag, target, words):
    first_image = dataset.parent / dataset.read_text().splitlines()[0]
    targets = {"list": dataset, "image": first_image, "long": tmp_path / ("x" * 300), "": Path("")}
    if target == "dangling":
        (tmp_path / "link.json").symlink_to(tmp_path / "no-such-folder" / "r.json")
        targets[target] = tmp_path / "link.json"
    if target == "fifo":
        os.mkfifo(tmp_path / "fifo.json")
        targets[target] = tmp_path / "fifo.json"
    if target == "pftrace-folder":
        (tmp_path / "t.pftrace").mkdir()
        targets[target] = tmp_path / "t"
    path = targets.get(target, tmp_path / target if "/" not in target else Path(target))
    args = ["--input-flist", path, *FAST] if flag == "--input-flist" else [flag, path]
    proc = run_cli(*args) if flag == "--input-flist" else _run(dataset, *args)
    assert proc.returncode == 2, proc.stderr
    _one_line_error(proc, words)
    assert first_image.read_bytes()[:2] == b"\xff\xd8" and dataset.read_text().startswith("val/")  # untouched


def test_a_broken_stdout_keeps_the_results_file(dataset, tmp_path):
    out = tmp_path / "r.json"
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--results-file", out)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ,
                            "PYTHONUNBUFFERED": "1"})  # fmt: skip
    proc.stdout.close()  # the reader left, as `| head -0` does
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert b"Traceback" not in stderr and read_json(out)["classified"] == 12
    out.unlink()
    with open("/dev/full", "w") as full_disk:  # and a full disk behind stdout
        full = subprocess.run(cmd, stdout=full_disk, stderr=subprocess.PIPE, text=True, timeout=300)
    assert full.returncode == 0 and "Traceback" not in full.stderr and read_json(out)["classified"] == 12


# --- Arguments and the environment ----------------------------------------------------------------


@pytest.mark.parametrize(
    "args, words",
    [
        (["--skip-bad", "--max-bad", "nan%"], "argument --max-bad"),
        (["--timeout", "nan"], "argument --timeout"),
        (["--timeout", "1e10"], "expected at most 1e6 seconds"),
        (["--trace", "t", "--breakdown"], "--trace profiles the run"),
        (["--model", "mobilenetv3_large_100.miil_in21k"], "11221 output classes, not ImageNet-1k's 1000"),
        (["--model", "vit_base_patch16_sapiens2.fb"], "its input is 768 x 1024, not square"),
        (["--model", "local-dir:TMP/no-config"], "cannot read its config"),
    ],
)
def test_argument_values_that_cannot_work_stop_at_the_start(dataset, tmp_path, args, words):
    args = [a.replace("TMP", str(tmp_path)) for a in args]
    proc = _run(dataset, *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    _one_line_error(proc, words)


@pytest.mark.parametrize(
    "env, words",
    [
        ({"WORLD_SIZE": "abc"}, "must be whole numbers"),
        ({"WORLD_SIZE": "2", "RANK": "0"}, "without MASTER_ADDR and MASTER_PORT"),
        ({"RANK": "-1"}, "RANK=-1 WORLD_SIZE=1 LOCAL_RANK=0: no such rank"),
        ({"TORCHINDUCTOR_CACHE_DIR": "/dev/null/cache"}, "torch cannot write its cache in /dev/null/cache"),
    ],
)
def test_an_environment_that_cannot_work_stops_at_the_start(dataset, env, words):
    extra = [] if "TORCHINDUCTOR_CACHE_DIR" not in env else ["--model", "test_efficientnet"]
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *TINY, *extra)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    assert proc.returncode == 2, proc.stderr
    _one_line_error(proc, words)


def test_out_of_memory_on_the_cpu_keeps_the_partial_result(dataset, tmp_path):
    lines = dataset.read_text().splitlines()
    dataset.write_text("\n".join(lines * 20) + "\n")  # 240 images in one batch

    def small_address_space() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (5_000_000_000, 5_000_000_000))

    out = tmp_path / "r.json"
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", "--model", "resnet50", "--no-pretrained",
               "--device", "cpu", "--no-compile", "--dtype", "float32", "--batch-size", "240", "--num-threads", "2",
               "--results-file", out)  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, preexec_fn=small_address_space)
    assert proc.returncode == 1, proc.stderr
    _one_line_error(proc, "out of memory on cpu with a batch of 240 images; try --batch-size 120")
    result = read_json(out)
    assert result["partial"] is True and result["not_reached"] == 240 and _accounted(result)


def test_checkpoints_that_are_not_state_dicts_are_one_line(dataset, tmp_path):
    class Runs:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    cases = {"text": None, "empty": None, "float-value": {"conv_stem.weight": 1.5}, "code": {"x": Runs()},
             "sparse": {"w": torch.eye(3).to_sparse()}}  # fmt: skip
    (tmp_path / "text.pth").write_text("not a checkpoint\n")
    (tmp_path / "empty.pth").write_bytes(b"")
    for name, state in cases.items():
        if state is not None:
            torch.save(state, tmp_path / f"{name}.pth")
        proc = _run(dataset, "--checkpoint", tmp_path / f"{name}.pth")
        assert proc.returncode == 2, (name, proc.stderr)
        _one_line_error(proc, "cannot load checkpoint")
        assert "weights_only=False" not in proc.stderr and "\x1b[" not in proc.stderr
    assert not (tmp_path / "ran").exists()


# --- Images --------------------------------------------------------------------------------------


def _photo(demo_photos: Path) -> Image.Image:
    return Image.open(demo_photos.parent / demo_photos.read_text().split()[0]).convert("RGB")


def _pil_mad(path: Path, decoded: torch.Tensor, transform: ic.EvalTransform, reference: np.ndarray | None = None):
    if reference is None:
        image = Image.open(path).convert("RGB")
        w, h, left, top = transform.geometry(*image.size)
        image = image.resize((w, h), Image.Resampling.BICUBIC).crop((left, top, left + 224, top + 224))
        reference = np.asarray(image)
    return np.abs(decoded.permute(1, 2, 0).numpy().astype(np.int16) - reference.astype(np.int16)).mean()


def test_rare_containers_decode_to_the_image(demo_photos, tmp_path):
    photo, transform = _photo(demo_photos), ic.EvalTransform()
    # An animated PNG whose default image is not part of the animation: PIL gives the default one.
    apng = tmp_path / "apng.JPEG"
    frames = [Image.new("RGB", photo.size, colour) for colour in ((20, 200, 20), (0, 0, 255))]
    photo.save(apng, format="PNG", save_all=True, default_image=True, append_images=frames)
    # 16-bit greyscale: PIL's own RGB conversion clips it to white.
    grey16 = (np.asarray(photo.convert("L"), dtype=np.uint16) * 257).astype(np.uint16)
    tiff16 = tmp_path / "grey16.JPEG"
    Image.fromarray(grey16).save(tiff16, format="TIFF")
    arithmetic = DATA / "arithmetic-coded.jpg"  # cjpeg -arithmetic: FFmpeg lacks arithmetic decoding
    decode = ic.get_decode_func("cpu", transform)
    images, _ = decode([(str(apng), 0), (str(tiff16), 1), (str(arithmetic), 2)])
    assert _pil_mad(apng, images[0], transform) < 1.0
    grey = Image.fromarray((grey16 >> 8).astype(np.uint8)).convert("RGB")
    w, h, left, top = transform.geometry(*grey.size)
    expected = np.asarray(grey.resize((w, h), Image.Resampling.BICUBIC).crop((left, top, left + 224, top + 224)))
    assert _pil_mad(tiff16, images[1], transform, expected) < 1.0 and images[1].float().mean() < 200
    assert _pil_mad(arithmetic, images[2], transform) < 1.5


def test_damaged_jpegs_and_bombs_are_counted_failures(demo_photos, tmp_path):
    data = (demo_photos.parent / demo_photos.read_text().split()[0]).read_bytes()
    sos = data.index(b"\xff\xda")
    rng = np.random.default_rng(0)
    flipped = bytearray(data)
    for i in rng.integers(sos + 200, len(data) - 200, 40):
        flipped[i] ^= 0x5A
    cut = data[: sos + (len(data) - sos) // 2] + b"\xff\xd9"  # a cut scan with an end marker put back
    bomb = io.BytesIO()
    Image.new("L", (16000, 16000)).save(bomb, format="PNG")  # small file, 256 Mpx
    strip = io.BytesIO()
    Image.new("RGB", (30000, 2)).save(strip, format="JPEG")  # would resize to 3840000 x 256
    files = {"flipped": bytes(flipped), "cut": cut, "bomb": bomb.getvalue(), "strip": strip.getvalue()}
    items = []
    for name, blob in files.items():
        (tmp_path / f"{name}.JPEG").write_bytes(blob)
        items.append((str(tmp_path / f"{name}.JPEG"), 0))
    policy = ic.BadImagePolicy(skip=True)
    images, _ = ic.get_decode_func("cpu", policy=policy)(items)
    reasons = {Path(f.path).stem: f.reason for f in policy.failures()}
    assert images.shape[0] == 0 and set(reasons) == set(files), reasons
    assert "over the limit of 178,956,970" in reasons["bomb"] and "would be resized to" in reasons["strip"]
    for path, _ in items[2:]:  # the DataLoader baseline's decoder refuses them too
        with pytest.raises(ic.ImageDecodeError):
            ic.decode_pil(path, ic.EvalTransform())


@pytest.mark.parametrize("error", [ConnectionResetError(104, "Connection reset by peer"), EOFError()])
def test_a_worker_dying_while_its_batch_is_handed_over_is_a_loader_failure(error):
    # When a worker dies as the main process fetches its batch's shared memory, the DataLoader
    # raises what the broken connection raised, not its "DataLoader worker ... killed" message.
    def batches():
        raise error
        yield

    with pytest.raises(
        ic.LoaderFailed, match=f"the DataLoader failed: a worker's connection broke \\({type(error).__name__}"
    ):
        next(ic.torch_loader_batches(batches(), torch.device("cpu"), ic.BadImagePolicy()))


def test_a_dead_dataloader_worker_stops_the_run_with_its_result(dataset, tmp_path):
    lines = dataset.read_text().splitlines()
    dataset.write_text("\n".join(lines * 100) + "\n")
    out = tmp_path / "r.json"
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--loader", "torch",
               "--num-threads", "2", "--results-file", out)  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while "images listed" not in proc.stderr.readline():
        assert proc.poll() is None
    time.sleep(3)
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert children, "no DataLoader worker"
    os.kill(int(children[0]), signal.SIGKILL)  # as the out-of-memory killer would
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    _one_line_error(subprocess.CompletedProcess(cmd, 1, stdout, stderr), "the DataLoader failed")
    result = read_json(out)
    assert result["partial"] is True and _accounted(result)


# --- Any argument value ------------------------------------------------------------------------------

NUMBERS = st.one_of(
    st.integers(-3, 40).map(str),
    st.sampled_from(["0", "-0", "1e309", "nan", "inf", "-inf", "2.5", "1e-9", "10000000000000000000000", "", " ", "x"]),
)
TEXTS = st.one_of(
    st.sampled_from(["", " ", "-", "/", ".", "/dev/null", "/dev/zero", "\n", "é", "a" * 300, "cpu", "cuda:-1", "meta"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
)
FLAGS = {
    "--batch-size": NUMBERS, "--num-threads": st.integers(1, 3).map(str) | NUMBERS, "--queue-size": NUMBERS,
    "--warmup-batches": NUMBERS, "--max-samples": NUMBERS, "--max-image-mb": NUMBERS, "--check-decoder": NUMBERS,
    "--parity": st.sampled_from(["0", "2", "-1", "x"]), "--stats-interval": NUMBERS,
    "--timeout": st.sampled_from(["30", "1e6", "1e7", "0", "-1", "nan", "inf", "x", ""]),
    "--device": TEXTS, "--dtype": TEXTS | st.sampled_from(["float32", "bfloat16"]), "--prefix": TEXTS,
    "--model": TEXTS | st.just("test_efficientnet"), "--max-bad": NUMBERS | NUMBERS.map(lambda v: v + "%"),
    "--results-file": TEXTS | st.just("r.csv"), "--predictions-file": TEXTS | st.just("p.csv"), "--trace": TEXTS,
    "--img-size": NUMBERS | st.sampled_from(["64", "4097"]), "--crop-pct": NUMBERS | st.sampled_from(["0.9", "1"]),
    "--interpolation": TEXTS | st.just("bilinear"), "-j": st.integers(1, 3).map(str) | NUMBERS,
}  # fmt: skip


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(sorted(FLAGS)), st.just(None), min_size=1, max_size=3).flatmap(
    lambda chosen: st.fixed_dictionaries({flag: FLAGS[flag] for flag in chosen})))  # fmt: skip
def test_any_argument_values_end_in_a_result_or_one_line(jpeg_set, tmp_path_factory, capfd, chosen):
    # Each run ends with exit 0 or 2 (3 only for a time-out too short for any batch), an error of
    # one line, and no traceback, whatever the values.
    workdir = tmp_path_factory.mktemp("any")
    argv = ["--input-flist", str(jpeg_set), "--prefix", f"{jpeg_set.parent}/", *TINY, "--no-compile",
            "--batch-size", "4", "--max-samples", "6", "--warmup-batches", "0", "--skip-bad"]  # fmt: skip
    for flag, value in chosen.items():
        argv += [flag, value]
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        status = ic.main(argv)
    except SystemExit as e:  # argparse
        status = e.code
    finally:
        os.chdir(cwd)
    out, err = capfd.readouterr()
    assert status in (0, 2), (argv, status, err[-2000:])
    assert "Traceback" not in err, (argv, err[-3000:])
    assert len([line for line in err.splitlines() if "error:" in line]) == (status != 0), (argv, err[-2000:])


def test_a_signal_stops_the_dataloader_baseline_quickly(dataset):
    # The DataLoader's busy workers are not joined (which takes seconds): the process ends after the report.
    lines = dataset.read_text().splitlines()
    dataset.write_text("\n".join(lines * 500) + "\n")
    cmd = _cli("--input-flist", dataset, "--prefix", f"{dataset.parent}/", *FAST, "--loader", "torch",
               "--num-threads", "8")  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while "images listed" not in proc.stderr.readline():
        assert proc.poll() is None
    time.sleep(3)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and time.monotonic() - sent < 2.0, stderr
    assert "(PARTIAL RUN)" in stdout and "Traceback" not in stderr
